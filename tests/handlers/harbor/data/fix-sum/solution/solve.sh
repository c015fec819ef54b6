#!/bin/bash
sed -i 's/numbers\[1:\]/numbers/' /workspace/total.py
