"""Regression: a long-lived Queue forgets the job ids of retired segments (it used to keep them all)."""

from ringq import Queue


def test_ids_of_retired_segments_are_forgotten_and_live_ones_kept(qdir):
    with Queue(qdir, durability="none", slot_size=128, slot_count=64) as q:
        for r in range(20):
            q.enqueue_many(list(range(50)), job_ids=[f"{r}-{i}" for i in range(50)])
            for job in q.lease(50):
                q.ack(job)
        q.enqueue("live", job_id="keep-me")
        q.lease(1)  # a later operation notices the retirements
        assert q.introspect()["known_ids"] < 200  # was 1,001: one entry per id ever enqueued
        assert q.enqueue("again", job_id="keep-me").payload == "live"  # idempotency of retained ids holds
        assert q.enqueue("new", job_id="0-0").payload == "new"  # a retired id is free again
