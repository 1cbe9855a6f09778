"""The short soak test with faults (helpers/serving/soak.py): a mix of good, malformed and degenerate
requests, clients hanging up and a cancel from the server side, against a server in this process.

Every target of the full soak holds on the short one: no 5xx, no good answer changed (greedy ones equal
`generate`, seeded sampled ones the engine alone), every error in OpenAI's shape, no block leaked, no
request left in the engine, resident memory after the soak within 10% of after the warm-up.
"""

from __future__ import annotations

from helpers.serving.soak import failures, run_soak, table


def test_a_short_soak_meets_every_target(shipped):
    model, _, tok = shipped
    report = run_soak(model, tok, n_requests=80, concurrency=16, seed=0, server_cancels=2, progress=False)
    print("\n" + table(report))
    assert failures(report) == []
    outcomes = report["outcomes"]
    assert sum(v for k, v in outcomes.items() if k.startswith("4")) >= 3  # the malformed ones were refused
    assert outcomes["hung up"] >= 3 and outcomes["200 ok (degenerate)"] >= 1
    assert report["checked"]["same"] >= 40
