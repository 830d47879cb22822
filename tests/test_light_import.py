"""What an enqueue loads: a queue used only to enqueue, and ``ringq enqueue`` from a shell, load
neither numpy nor the reader's side (the index, the reaper, the admin reads, the periodic jobs);
the first read builds it, with the catch-up and the reaper pass every reader starts with.
docs/benchmarks.md measures the start-up against nobroker's."""

from __future__ import annotations

from procs import run_py

HEAVY = ("numpy", "ringq.engine.index", "ringq.engine.reaper", "ringq.local.admin",
         "ringq.local.schedule", "ringq.local.leases", "ringq.engine.verify")


def test_a_queue_used_only_to_enqueue_loads_no_numpy_nor_the_reader(tmp_path):
    out = run_py(
        """
        import sys
        from ringq import Queue
        q = Queue(sys.argv[1])
        q.enqueue({"a": 1})
        q.enqueue_many([1, 2])
        print(sorted(m for m in sys.argv[2:] if m in sys.modules))
        print(q.stats().ready, "ringq.engine.index" in sys.modules)  # the first read builds it
        a = q.enqueue("x", job_id="once")
        print(q.enqueue("y", job_id="once").seq == a.seq)  # an id: found by the reader's index
        """,
        str(tmp_path), *HEAVY,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["[]", "3 True", "True"], out.stdout


def test_cli_enqueue_of_one_job_loads_no_numpy(tmp_path):
    code = """
        import sys
        from ringq.cli import main
        d, heavy = sys.argv[1], sys.argv[2:]
        for _ in range(2):  # creating the queue, then appending to it
            sys.argv = ["ringq", "-d", d, "enqueue", '{"a":1}']
            try:
                main()
            except SystemExit as exc:
                assert not exc.code, exc.code
        print(sorted(m for m in heavy if m in sys.modules))
        """
    out = run_py(code, str(tmp_path), *HEAVY)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "[]", out.stdout


def test_encoding_while_another_thread_imports_numpy(tmp_path):
    # numpy is in sys.modules, half initialised, while its first import runs: the encoder took it
    # for loaded and read its ndarray attribute (AttributeError from enqueue in another thread).
    code = """
        import sys, threading
        from ringq import Queue
        q = Queue(sys.argv[1], durability="none")
        errors, stop = [], threading.Event()
        def loop():
            while not stop.is_set():
                try:
                    q.enqueue({"x": 1})
                except Exception as exc:
                    errors.append(repr(exc))
                    return
        threads = [threading.Thread(target=loop) for _ in range(2)]
        for t in threads:
            t.start()
        import numpy
        stop.set()
        for t in threads:
            t.join()
        q.enqueue(numpy.arange(3))  # and arrays, once it is imported
        print(errors)
        """
    for i in range(3):
        out = run_py(code, str(tmp_path / str(i)))
        assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)
