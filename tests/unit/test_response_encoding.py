"""An answer spliced from its result's own encoding (``codec.encode_response``, used by the
quick reads to reuse an encoding, SPEC §1.4) is byte for byte the encoded Response."""

from __future__ import annotations

import msgspec
import pytest

from dagctx.protocol import codec
from dagctx.protocol import messages as m


def _info(i: int) -> m.SessionInfo:
    return m.SessionInfo(session_id=f"s{i}", title=f"t \"{i}\" ✓ \u2028", root_id=None, head=f"h{i}",
                         created_at=1.5 + i, updated_at=2.25, node_count=i, metadata={"k": [i, None, {"x": "é"}]})


RESULTS = [
    m.SessionListResult(sessions=[_info(i) for i in range(3)], total=3),
    m.SessionListResult(sessions=[], total=0),
    _info(7),
    None,
    {"plain": [1, 2.5, "x"]},
]


@pytest.mark.parametrize("msg_id", [0, 1, -7, 2**63 - 1, "", "id", 'quo"te\\ \n ✓', None])
@pytest.mark.parametrize("result", RESULTS)
def test_a_spliced_answer_is_the_encoded_response(msg_id: object, result: object) -> None:
    whole = codec.encoder.encode(codec.Response(id=msg_id, result=result))  # type: ignore[arg-type]
    assert codec.encode_response(msg_id, codec.encoder.encode(result)) == whole  # type: ignore[arg-type]
    decoded = msgspec.json.decode(whole)
    assert decoded["id"] == msg_id and decoded["jsonrpc"] == "2.0"
