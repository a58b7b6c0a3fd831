"""P² reduction language: communicators, state semantics, synthesis and pruning."""

import random
from math import prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scenarios.p2.programs import InvalidStep, Step, SynthSpace, program_label
from scenarios.p2.synth import default_program, synthesize


def S(op, lo, hi, form="InsideGroup"):
    return Step(op, lo, hi, form)


def test_communicators_of_the_three_forms():
    sp = SynthSpace((2, 4), ("node", "gpu"))  # member t = node * 4 + gpu
    assert sp.communicators(S("AllReduce", 1, 2)) == ((0, 1, 2, 3), (4, 5, 6, 7))            # inside node
    assert sp.communicators(S("AllReduce", 1, 2, "Parallel")) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert sp.communicators(S("AllReduce", 1, 2, "Master")) == ((0, 4),)                     # gpu 0 of each
    assert sp.communicators(S("AllReduce", 0, 2)) == (tuple(range(8)),)
    assert sp.communicators(S("AllReduce", 0, 2, "Parallel")) == ()                           # size-1 groups
    # Parallel over the gpu level == InsideGroup over the node level: the alphabet keeps one.
    names = [s.label(sp.names) for s in sp.alphabet() if s.op == "AllReduce"]
    assert names == ["AllReduce(node, InsideGroup)", "AllReduce(node+gpu, InsideGroup)",
                     "AllReduce(gpu, InsideGroup)", "AllReduce(node, Master)", "AllReduce(gpu, Master)"]
    with pytest.raises(ValueError, match="not one of"):
        Step("AllToAll", 0, 1)
    with pytest.raises(ValueError, match="empty"):
        Step("AllReduce", 1, 1)


def test_semantics_of_each_collective():
    sp = SynthSpace((4,))
    full = sp.full
    s = sp.apply(sp.initial, S("ReduceScatter", 0, 1))
    assert [sp.held(s, t) for t in range(4)] == [(0,), (1,), (2,), (3,)]
    assert all(s[t][t] == full for t in range(4))
    assert sp.apply(s, S("AllGather", 0, 1)) == sp.goal
    r = sp.apply(sp.initial, S("Reduce", 0, 1))
    assert r[0] == (full,) * 4 and all(r[t] == (0,) * 4 for t in (1, 2, 3))
    assert sp.apply(r, S("Broadcast", 0, 1)) == sp.goal
    assert sp.apply(sp.initial, S("AllReduce", 0, 1)) == sp.goal


def test_invalid_steps_are_rejected():
    sp = SynthSpace((2, 2))
    with pytest.raises(InvalidStep, match="hold unequal or no parts|held by both"):
        sp.apply(sp.initial, S("AllGather", 0, 2))            # everyone holds everything: not disjoint
    once = sp.apply(sp.initial, S("AllReduce", 0, 2))
    with pytest.raises(InvalidStep, match="twice"):
        sp.apply(once, S("AllReduce", 1, 2))                  # would double-count
    rs = sp.apply(sp.initial, S("ReduceScatter", 1, 2))
    with pytest.raises(InvalidStep, match="different chunks"):
        sp.apply(rs, S("AllReduce", 1, 2))                    # members hold different halves
    # a hand-made state: members 0 and 1 hold 3 of the 4 chunks, which do not split in two
    three = ((1, 1, 1, 0), (2, 2, 2, 0), (4, 4, 4, 4), (8, 8, 8, 8))
    with pytest.raises(InvalidStep, match="do not split"):
        sp.apply(three, S("ReduceScatter", 1, 2))
    assert not sp.is_valid((S("AllReduce", 1, 2),))           # incomplete


def test_one_level_programs_by_hand():
    # One level of 4: from the start only AllReduce, ReduceScatter and Reduce are valid (AllGather
    # needs disjoint parts, Broadcast makes no progress). AR is complete; RS completes with AG;
    # Reduce completes with Broadcast. Nothing else completes within 3 steps.
    sp = SynthSpace((4,), ("gpu",))
    progs = synthesize(sp, 3).programs
    assert [program_label(p, sp.names) for p in progs] == [
        "AllReduce(gpu, InsideGroup)",
        "ReduceScatter(gpu, InsideGroup); AllGather(gpu, InsideGroup)",
        "Reduce(gpu, InsideGroup); Broadcast(gpu, InsideGroup)",
    ]


def test_papers_figure3_and_hierarchical_programs_are_synthesised():
    sp = SynthSpace((2, 4), ("node", "gpu"))
    res = synthesize(sp, 3)
    progs = set(res.programs)
    assert default_program(sp) in progs                                             # Fig. 3(a)
    assert (S("AllReduce", 1, 2), S("AllReduce", 0, 1)) in progs                    # Fig. 3(b)
    assert (S("Reduce", 1, 2), S("AllReduce", 1, 2, "Master"), S("Broadcast", 1, 2)) in progs  # 3(c)
    assert (S("ReduceScatter", 1, 2), S("AllReduce", 0, 1), S("AllGather", 1, 2)) in progs  # 2D ring
    assert len(progs) == len(res.programs) == 30
    st_ = res.stats
    assert st_.programs == 30 and st_.invalid > 0 and st_.no_progress > 0 and st_.dead_end > 0
    assert st_.expanded == (st_.invalid + st_.no_progress + st_.dead_end + st_.revisited + st_.at_bound
                            + st_.kept + st_.programs)
    assert all(len(p) <= 3 for p in res.programs)
    assert [len(p) for p in res.programs] == sorted(len(p) for p in res.programs)


def _numeric_run(sp: SynthSpace, program, seed: int) -> bool:
    """Independent check with numbers: each member starts with random integers per chunk, the
    collectives sum them; at the end every member must hold every chunk's group total."""
    rnd = random.Random(seed)
    val = [{c: rnd.randrange(1, 10**6) for c in range(sp.k)} for _ in range(sp.k)]
    total = {c: sum(val[t][c] for t in range(sp.k)) for c in range(sp.k)}
    for step in program:
        new = [dict(v) for v in val]
        for comm in sp.communicators(step):
            held = sorted(val[comm[0]])
            if step.op in ("AllReduce", "ReduceScatter", "Reduce"):
                sums = {c: sum(val[t][c] for t in comm) for c in held}
                if step.op == "AllReduce":
                    for t in comm:
                        new[t] = dict(sums)
                elif step.op == "Reduce":
                    new[comm[0]] = dict(sums)
                    for t in comm[1:]:
                        new[t] = {}
                else:
                    part = len(held) // len(comm)
                    for i, t in enumerate(comm):
                        new[t] = {c: sums[c] for c in held[i * part:(i + 1) * part]}
            elif step.op == "AllGather":
                merged = {c: x for t in comm for c, x in val[t].items()}
                for t in comm:
                    new[t] = dict(merged)
            else:
                for t in comm[1:]:
                    new[t].update(val[comm[0]])
        val = new
    return all(v == total for v in val)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([2, 3, 4]), min_size=1, max_size=3).filter(lambda s: prod(s) <= 24),
       st.integers(1, 3), st.integers(0, 2**31))
def test_every_synthesised_program_is_valid(sizes, max_len, seed):
    sp = SynthSpace(sizes)
    res = synthesize(sp, max_len)
    assert default_program(sp) in res.programs
    for prog in res.programs:
        assert 1 <= len(prog) <= max_len
        assert sp.is_goal(sp.run(prog))          # the state model reaches the goal
        assert _numeric_run(sp, prog, seed)      # and the sums come out exactly once each


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([2, 3]), min_size=1, max_size=2), st.data())
def test_random_programs_are_valid_iff_state_and_numbers_agree(sizes, data):
    # A random step sequence that the state model accepts as complete also sums correctly.
    sp = SynthSpace(sizes)
    alpha = sp.alphabet()
    prog = tuple(data.draw(st.lists(st.sampled_from(alpha), min_size=1, max_size=4)))
    try:
        ok = sp.is_goal(sp.run(prog))
    except InvalidStep:
        return
    if ok:
        assert _numeric_run(sp, prog, 7)


def test_synthesis_is_deterministic_and_bounded():
    sp = SynthSpace((2, 2, 2))
    a, b = synthesize(sp, 3), synthesize(sp, 3)
    assert a.programs == b.programs
    assert synthesize(sp, 3, max_programs=5).programs == a.programs[:5]
    with pytest.raises(ValueError, match="max_len"):
        synthesize(sp, 0)
