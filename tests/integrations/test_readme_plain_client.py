"""The README's plain-client snippet ("## Train with it"; docs/train-plain-client.md shows
the same block), run as written against a live
``rollserve serve`` and a scripted fake vLLM, and the results-cursor pattern the README
describes next to it: the cursor gives every result, the group's verdict says which to
train on."""

import contextlib
import io
import itertools
import re
from pathlib import Path

from rollserve.client import Client

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGE = ROOT / "docs" / "train-plain-client.md"


def plain_client_snippet() -> str:
    text = README.read_text()
    section = text[text.index("## Train with it\n") :]
    section = section[: section.index("\n## ", 1)]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def test_the_docs_page_shows_the_same_snippet() -> None:
    (code,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert code == plain_client_snippet()


def test_the_plain_client_snippet_trains_on_used_samples_only(server_factory, fake_llm_thread):
    answers = itertools.count()

    def reply(prompt_ids: list[int], text: str) -> str:
        if "7 * 6" in text:  # right and wrong in turn: a group with an advantage signal
            return "It is \\boxed{42}." if next(answers) % 2 == 0 else "It is \\boxed{41}."
        return "It is \\boxed{4}."  # always right: the filter drops the group

    fake = fake_llm_thread(replies=reply)
    server = server_factory("--backend", fake.url).start(timeout=180)
    code = plain_client_snippet()
    assert code.count("http://127.0.0.1:8000") == 1
    namespace: dict[str, object] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace("http://127.0.0.1:8000", server.url), "README.md", "exec"), namespace)
    batch = namespace["batch"]
    assert isinstance(batch, list) and len(batch) == 4  # the 7 * 6 group's n used samples
    # Its 6 samples alternate right and wrong; the 4 used are the first 4 to finish, so
    # the split depends on timing, but a usable group has both (it was not filtered).
    assert {reward for *_, reward in batch} == {0.0, 1.0}
    for input_ids, loss_mask, logprobs, _ in batch:
        assert len(input_ids) == len(loss_mask) == len(logprobs) and sum(loss_mask) > 0
    lines = printed.getvalue().splitlines()
    assert len(lines) == 2 and "['zero_variance']" in lines[0] and lines[1] == "4 samples to train on"

    # The results cursor: every result of both groups comes through (extras and all);
    # once a group's rollouts have all come through, wait_group's verdict says which to use.
    accepted = namespace["accepted"]
    wanted = {rid: group.group_id for group in accepted.groups for rid in group.rollout_ids}
    with Client(server.url) as rs:
        streamed = {r.id: r for r in rs.stream_results(after=0, wait=30, until=len(wanted))}
        assert set(streamed) == set(wanted)
        used_tokens = []
        for group in accepted.groups:
            view = rs.wait_group(group.group_id, timeout=60)
            assert view.done
            used = {m.id for m in view.rollouts if m.used}
            assert len(used) == 4 and len(group.rollout_ids) == 6
            if view.usable:
                used_tokens += [streamed[rid].trajectory.tokens.input_ids for rid in used]
            else:
                assert view.reasons == ["zero_variance"]
    assert sorted(used_tokens) == sorted(input_ids for input_ids, *_ in batch)
