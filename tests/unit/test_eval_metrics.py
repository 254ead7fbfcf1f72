"""The arithmetic of ``dagctx eval`` (issue #23) on requests written here, where every
number is known: identifier classes, byte-stable prefixes, cache cost, breaks and their
size, overshoot, the naive baseline. The replay through the daemon is tested in
``tests/integration/test_eval.py``."""

from __future__ import annotations

from dagctx.cli.quality import cache as cm
from dagctx.cli.quality import identifiers as ids
from dagctx.cli.quality import summarizer

COUNTER = cm.TokenCounter()


def words(n: int, word: str = "hello") -> str:
    """A text of exactly ``n`` cl100k tokens: ``word`` then ``n - 1`` times `` word``."""
    text = " ".join([word] * n)
    assert COUNTER.text(text) == n
    return text


def msg(role: str, text: str) -> dict:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def test_identifier_classes() -> None:
    got = ids.extract("see https://example.com/x?y=1, commit 3f2a9bc1 (toolu_01AbCdEf12), "
                      "src/app/main.py and mix.exs; parse_config() calls os.path.join and ParseConfig; "
                      "port 8080, and/or input/output")
    assert got == {"https://example.com/x?y=1": "url", "toolu_01AbCdEf12": "id", "3f2a9bc1": "hash",
                   "src/app/main.py": "path", "mix.exs": "path", "parse_config": "symbol",
                   "os.path.join": "symbol", "ParseConfig": "symbol", "8080": "number"}
    assert ids.retention(got, "only src/app/main.py and 8080 here")["path"] == [1, 2]
    assert ids.retention(got, "only src/app/main.py and 8080 here")["number"] == [1, 1]


def test_a_cache_break_of_known_size() -> None:
    a, b, b2, c = words(100), words(50, "apple"), words(20, "pear"), words(30, "cat")
    seq = [cm.Sent(0.0, "sys", [msg("user", a), msg("assistant", b)]),
           cm.Sent(10.0, "sys", [msg("user", a), msg("assistant", b), msg("user", c)]),
           cm.Sent(20.0, "sys", [msg("user", a), msg("assistant", b2), msg("user", c)])]
    econ = cm.economics(seq, COUNTER, ttl=300)
    f = cm.FRAMING
    sys_t = COUNTER.text("sys") + f
    r0, r1, r2 = econ["rows"]
    assert r0["tokens"] == sys_t + 100 + 50 + 2 * f and r0["cacheRead"] == 0 and r0["cacheWrite"] == r0["tokens"]
    # request 2 extends request 1: its whole previous request is read from the cache
    assert r1["prefixUnits"] == 3 and r1["cacheRead"] == r0["tokens"] and r1["cacheWrite"] == 30 + f
    assert "break" not in r1
    # request 3 changes the assistant message: the prefix ends there
    assert r2["prefixUnits"] == 2 and r2["cacheRead"] == sys_t + 100 + f
    (brk,) = econ["breaks"]
    assert brk["index"] == 2 and brk["atUnit"] == 2
    assert brk["invalidated"] == (50 + f) + (30 + f)
    assert brk["rewritten"] == (20 + f) + (30 + f)
    assert brk["cause"] == "other"
    total = econ["totals"]
    assert total["breaks"] == 1
    assert total["cost"] == round(sum(cm.WRITE_PRICE * r["cacheWrite"] + cm.READ_PRICE * r["cacheRead"]
                                      for r in (r0, r1, r2)), 2)


def test_a_cold_cache_reads_nothing() -> None:
    a = words(100)
    seq = [cm.Sent(0.0, None, [msg("user", a)]), cm.Sent(1000.0, None, [msg("user", a), msg("user", a)])]
    econ = cm.economics(seq, COUNTER, ttl=300)
    assert econ["rows"][1]["prefixUnits"] == 1 and not econ["rows"][1]["warm"]
    assert econ["rows"][1]["cacheRead"] == 0 and econ["rows"][1]["cacheWrite"] == 2 * (100 + cm.FRAMING)


def test_break_causes_are_the_daemons_the_bytes_decide_the_break() -> None:
    """M5 names a break's causes as the daemon reported them (``cacheBreak``), but only the
    bytes say whether there was one; a break the daemon did not report is ``unreported``."""
    assert cm.break_causes(["compaction", "aging"], "p", "p") == ["compaction", "aging"]
    assert cm.break_causes([], "p", "p") == ["unreported"]
    assert cm.break_causes(None, "p", "q") == ["systemPrompt"] and cm.break_causes(None, "p", "p") == ["other"]
    a, b = words(50), words(60)
    seq = [cm.Sent(0.0, None, [msg("user", a), msg("user", a)], causes=[]),
           cm.Sent(1.0, None, [msg("user", a), msg("user", b)], causes=["checkpoint"]),
           cm.Sent(2.0, None, [msg("user", a), msg("user", b), msg("user", a)], causes=["aging"]),
           cm.Sent(3.0, None, [msg("user", b)], causes=[])]
    econ = cm.economics(seq, COUNTER)
    # the aging the daemon named at request 2 broke nothing: the bytes extend request 1
    assert [b["index"] for b in econ["breaks"]] == [1, 3]
    assert econ["breaks"][0]["causes"] == ["checkpoint"] and econ["breaks"][1]["causes"] == ["unreported"]
    assert econ["byCause"]["checkpoint"]["invalidated"] == 50 + cm.FRAMING


def test_an_overshoot_is_caught() -> None:
    a = words(900)
    seq = [cm.Sent(0.0, None, [msg("user", words(10))]), cm.Sent(1.0, None, [msg("user", a)])]
    econ = cm.economics(seq, COUNTER, window=1000, max_output=200)
    assert econ["rows"][0]["overshoot"] == 0
    assert econ["rows"][1]["overshoot"] == 900 + cm.FRAMING + 200 - 1000
    m4 = cm.budget(seq, econ, 1000, [200, 200])
    assert m4["overshootRequests"] == 1 and m4["maxOvershoot"] == 104 and m4["maxShare"] == 0.904


def test_the_unmanaged_baseline_stops_at_the_overflow() -> None:
    class B:
        def __init__(self, at: float, messages: list) -> None:
            self.at, self.system, self.messages = at, None, messages

    hist: list = []
    base = []
    for i in range(6):
        hist = hist + [msg("user", words(200))]
        base.append(B(float(i), list(hist)))
    seq = cm.unmanaged(base, 1000, 100, COUNTER)
    # 204 tokens a message: 4 messages + 100 fit in 1,000, 5 do not
    assert [s.served for s in seq] == [True, True, True, True, False, False]
    naive, compactions, sampled = cm.naive(base, 1000, 100, COUNTER, summarizer.summarize)
    assert compactions >= 1 and all(s.served for s in naive)
    # every compaction sent the summarizer the folded history and got a summary back
    assert sampled["calls"] == compactions and sampled["input"] > 600 and 0 < sampled["output"] < sampled["input"]
    assert sampled["cost"] == sampled["input"] * cm.SUMMARIZER_INPUT_PRICE + sampled["output"] * cm.SUMMARIZER_OUTPUT_PRICE
    lead = naive[-1].messages[0]["content"][0]["text"]
    assert lead.startswith(cm.NAIVE_MARKER)
    # the summarizer was shown a transcript like dagctx's: it quotes the user's messages
    assert "- user: hello hello" in lead


def test_the_naive_summary_takes_the_shape_of_the_requests_user_messages() -> None:
    blocks = [{"role": "user", "content": [{"type": "text", "text": "hi"}], "nodeIds": ["u1"]}]
    strings = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert cm.user_text_message("S", blocks) == {"role": "user", "content": [{"type": "text", "text": "S"}]}
    assert cm.user_text_message("S", strings) == {"role": "user", "content": "S"}


def test_the_stand_in_is_labelled_deterministic_and_short() -> None:
    text = "<conversation>\n[user]\nfix src/app.py\n\n[tool result: Read]\n" + "parse_config = 1\n" * 400 + "</conversation>"
    a, b = summarizer.summarize(text, 1000), summarizer.summarize(text, 1000)
    assert a == b and a.startswith(summarizer.LABEL)
    assert "src/app.py" in a and "parse_config" in a and len(a) < len(text) / 4
    retry = text + "\n\ncopy each of these exactly where it belongs:\n- zebra_quartz\n- 424242\n"
    assert "zebra_quartz" in summarizer.summarize(retry, 1000) and "424242" in summarizer.summarize(retry, 1000)


def test_dropped_reasoning_breaks_at_its_message() -> None:
    """A new user turn that no longer sends a thinking block breaks the prefix at that
    message (the bytes say where); the cause is the daemon's word for it."""
    think = {"role": "assistant", "content": [{"type": "thinking", "thinking": words(40), "signature": "s"},
                                              {"type": "text", "text": words(10)}]}
    plain = {"role": "assistant", "content": [{"type": "text", "text": words(10)}]}
    seq = [cm.Sent(0.0, None, [msg("user", words(5)), think], causes=[]),
           cm.Sent(1.0, None, [msg("user", words(5)), plain, msg("user", words(5))], causes=["reasoning"])]
    (brk,) = cm.economics(seq, COUNTER)["breaks"]
    assert brk["cause"] == "reasoning" and brk["atUnit"] == 1
    assert brk["invalidated"] == COUNTER.unit(cm.canon(think), think)  # the whole dropped message
