"""The discrete-event kernel: dependencies, GPU capacity, progressive release, determinism."""

from rlperf.sim.kernel import Kernel, Task, TaskRun


def fixed(d: float, **kw: object):  # type: ignore[no-untyped-def]
    return lambda now, grant: TaskRun(duration_s=d, **kw)  # type: ignore[arg-type]


def test_chain_on_one_pool_serializes() -> None:
    k = Kernel({"p": 8})
    k.add(Task("a", (0,), (), {"p": (8, 8)}, fixed(2.0)))
    k.add(Task("b", (1,), (), {"p": (8, 8)}, fixed(3.0)))
    k.add(Task("c", (2,), ("a",), {"p": (4, 4)}, fixed(1.0)))
    k.run()
    assert k.task("a").end_s == 2.0
    assert k.task("b").start_s == 2.0 and k.task("b").end_s == 5.0
    assert k.task("c").start_s == 5.0


def test_independent_pools_overlap() -> None:
    k = Kernel({"r": 4, "t": 4})
    k.add(Task("gen", (0,), (), {"r": (4, 4)}, fixed(5.0)))
    k.add(Task("train", (1,), (), {"t": (4, 4)}, fixed(3.0)))
    k.run()
    assert k.task("train").end_s == 3.0 and k.task("gen").end_s == 5.0


def test_progressive_release_lets_elastic_task_backfill() -> None:
    k = Kernel({"p": 8})
    k.add(Task("gen", (0,), (), {"p": (8, 8)}, fixed(10.0, releases=((4.0, "p", 4),), milestones=((4.0, "half"),))))
    k.add(Task("fwd", (1,), ("half",), {"p": (1, 8)}, lambda now, g: TaskRun(duration_s=8.0 / g["p"])))
    k.run()
    fwd = k.task("fwd")
    assert fwd.start_s == 4.0 and fwd.granted == {"p": 4} and fwd.end_s == 6.0


def test_same_inputs_same_schedule() -> None:
    def build() -> list[tuple[str, float, float]]:
        k = Kernel({"p": 2})
        for i in range(20):
            k.add(Task(f"t{i}", (i % 3, i), (), {"p": (1, 1)}, fixed(1.0 + (i * 7) % 5)))
        k.run()
        return [(t.name, t.start_s, t.end_s) for t in k.done]

    assert build() == build()
