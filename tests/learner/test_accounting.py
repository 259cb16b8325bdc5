"""accounting.balance: whether the group ledger closes, and if not, which process's groups are
missing and what the learner made of them, by hand-worked cases."""
from builders import make_group, make_status

from grpo.learner.accounting import Books, MessageLedger, balance


def ledger(books: Books, queued: int = 0) -> dict:
    """The learner's group ledger for books whose received groups were all trained but `queued`."""
    sent, dropped = books.totals()
    received = sum(e.received for e in books.entries.values())
    trained = received - queued
    return {"received": received, "trained": trained, "dropped": dropped, "queued": queued, "sent": sent,
            "balanced": sent == trained + sum(dropped.values()) + queued}


def books_with(*processes) -> Books:
    """processes: (sampler id, incarnation, groups received, final status's groups_sent, its stats)."""
    b = Books()
    for sid, inc, received, sent, stats in processes:
        for i in range(received):
            b.group(make_group(sampler_id=sid, incarnation=inc, group_id=f"{sid}-{i}"), version=0)
        b.status(make_status(sid, inc, groups_sent=sent, final=True, **stats), 0)
    return b


def test_balanced_books_say_balanced():
    b = books_with((0, 1, 3, 5, {"dropped_zero_signal": 2.0}))
    got = balance(ledger(b, queued=1), b, MessageLedger())
    assert got == {"text": "balanced", "gap": 0, "by_process": [], "learner_gap": 0, "unattributable": {},
                   "explained": True}


def test_unattributable_messages_explain_the_missing_groups_of_two_samplers():
    b = books_with((0, 1, 3, 4, {}), (1, 2, 2, 4, {}))
    m = MessageLedger()
    for reason in ("bad_schema", "bad_schema", "bad_header"):
        m.reject("data", reason)
    m.reject("sync", "bad_schema")   # the sync port carries no groups: not counted as one
    acc = ledger(b)
    assert acc["balanced"] is False
    got = balance(acc, b, m)
    assert got["text"] == ("balanced except 1 group sent by sampler 0 and 2 groups sent by sampler 1 that "
                           "arrived as unattributable messages: bad_header 1, bad_schema 2")
    assert got["gap"] == 3 and got["explained"] is True and got["unattributable"] == {"bad_header": 1, "bad_schema": 2}
    assert got["by_process"] == [{"sampler_id": 0, "incarnation": 1, "sent": 4, "accounted": 3, "gap": 1},
                                 {"sampler_id": 1, "incarnation": 2, "sent": 4, "accounted": 2, "gap": 2}]


def test_a_gap_no_message_can_explain_is_named_not_balanced():
    # Fewer unattributable messages than missing groups.
    b = books_with((0, 1, 1, 3, {}))
    m = MessageLedger()
    m.reject("data", "bad_schema")
    got = balance(ledger(b), b, m)
    assert got["explained"] is False and got["gap"] == 2
    assert got["text"] == ("NOT balanced (sent 3, accounted 1): sampler 0 (process 1) says it sent 3, 1 are "
                           "accounted for; unattributable data messages: bad_schema 1")
    # A final status that counts fewer groups than arrived or were dropped by the sampler itself
    # (a sampler that forgot to count a round it filtered whole): named, never "explained".
    b = books_with((2, 9, 2, 5, {"dropped_zero_signal": 4.0}))
    got = balance(ledger(b), b, MessageLedger())
    assert got["gap"] == -1 and got["explained"] is False
    assert got["text"] == "NOT balanced (sent 5, accounted 6): sampler 2 (process 9) says it sent 5, 6 are accounted for"
