"""``node/get`` with ``includeCallees``: a turn whole (SPEC §4), on a real daemon."""

from __future__ import annotations

import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import messages as m


async def test_include_callees_returns_the_caller_subtree_once_in_seq_order(daemon: DagctxClient) -> None:
    c = daemon
    s = await c.session_create("callees")
    u = await c.append(s.session_id, "user", output="go", predecessor=s.head)
    llm = await c.append(s.session_id, "llm", name="m", output="calling", predecessor=u.head)
    fn = await c.append(s.session_id, "code", name="subagent", input={"task": "t"}, status="running",
                        caller=llm.node.id, metadata={"toolCallId": "call_1"})
    inner = await c.append(s.session_id, "llm", name="m", output="inner", caller=fn.node.id)
    leaf = await c.append(s.session_id, "code", name="bash", input={"cmd": "ls"}, output="a.py",
                          caller=inner.node.id, metadata={"toolCallId": "call_2"})
    await c.update(s.session_id, fn.node.id, "completed", output="done")
    reply = await c.append(s.session_id, "llm", name="m", output="finished", predecessor=llm.head)

    got = await c.get_nodes(s.session_id, [u.node.id, llm.node.id, reply.node.id], include_callees=True)
    assert [n.id for n in got.nodes] == [u.node.id, llm.node.id, reply.node.id]
    assert [n.id for n in got.callees] == [fn.node.id, inner.node.id, leaf.node.id]
    assert got.callees[0].output == "done" and got.callees[0].status == "completed"

    # asking for a parent and its child: each node once, none of the named ones in callees
    both = await c.get_nodes(s.session_id, [llm.node.id, inner.node.id], include_callees=True)
    assert [n.id for n in both.callees] == [fn.node.id, leaf.node.id]
    # a range applies to the named nodes only
    ranged = await c.get_nodes(s.session_id, [llm.node.id], range=m.OutputRange(offset=0, length=3),
                               include_callees=True)
    assert ranged.nodes[0].output == "cal" and ranged.callees[2].output == "a.py"
    # without the flag: as before
    assert (await c.get_nodes(s.session_id, [llm.node.id])).callees == []
    with pytest.raises(RpcError) as err:
        await c.get_nodes(s.session_id, ["missing"], include_callees=True)
    assert err.value.kind == "NodeNotFound"
