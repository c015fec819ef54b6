"""The cluster routes and fields on a single-machine server: /v1/status says there are
no nodes (null), draining a node is a 404 that says why, /metrics has no node series."""


async def test_one_machine_has_no_nodes(make_api):
    service, client = await make_api()
    assert (await client.get("/v1/status")).json()["nodes"] is None
    for action in ("drain", "undrain"):
        r = await client.post(f"/v1/nodes/node0/{action}")
        assert r.status_code == 404, r.text
        assert "no node named 'node0'" in r.text and "--ray" in r.text
    assert "rollserve_node_" not in (await client.get("/metrics")).text
