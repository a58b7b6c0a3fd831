"""Pipeline schedules against their closed forms (SC'21 §2.2, Megatron-LM's schedules)."""

import pytest

from workload.parallel.schedules import (
    Step,
    bubble_fraction,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    recv_posts,
    schedule,
)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 8), (4, 2), (2, 16)])
def test_1f1b_warmup_and_counts(p, m):
    for s in range(p):
        steps = one_f_one_b(p, m, s)
        assert [x.kind for x in steps].count("F") == m
        assert [x.kind for x in steps].count("B") == m
        warm = 0
        while warm < len(steps) and steps[warm].kind == "F":
            warm += 1
        # p - s - 1 warm-up forwards, then the first 1F1B pair's forward
        assert warm == min(p - s - 1, m) + (1 if m > p - s - 1 else 0)
        # forwards and backwards each in micro-batch order
        assert [x.microbatch for x in steps if x.kind == "F"] == list(range(m))
        assert [x.microbatch for x in steps if x.kind == "B"] == list(range(m))
        # at most p - s micro-batches in flight (1F1B's memory bound)
        live = peak = 0
        for x in steps:
            live += 1 if x.kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(p - s, m)


def test_gpipe_all_forward_then_backward():
    steps = gpipe(4, 3, 1)
    assert "".join(x.kind for x in steps) == "FFFBBB"
    assert [x.microbatch for x in steps] == [0, 1, 2, 2, 1, 0]


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (2, 4, 3), (4, 4, 4)])
def test_interleaved_counts_and_chunk_order(p, m, v):
    for s in range(p):
        steps = interleaved_1f1b(p, m, s, v)
        fw = [(x.microbatch, x.chunk) for x in steps if x.kind == "F"]
        bw = [(x.microbatch, x.chunk) for x in steps if x.kind == "B"]
        assert sorted(fw) == sorted(bw) == sorted((i, c) for i in range(m) for c in range(v))
        # every micro-batch goes through chunk c before chunk c+1 in forward, the reverse in backward
        for i in range(m):
            assert [c for mb, c in fw if mb == i] == list(range(v))
            assert [c for mb, c in bw if mb == i] == list(reversed(range(v)))
        warm = 0
        while steps[warm].kind == "F":
            warm += 1
        assert warm == min((p - s - 1) * 2 + (v - 1) * p, m * v) + (1 if (p - s - 1) * 2 + (v - 1) * p < m * v else 0)


def test_interleaved_needs_multiple_of_p():
    with pytest.raises(ValueError, match="multiple"):
        interleaved_1f1b(4, 6, 0, 2)


def test_bubble_fraction_closed_form():
    assert bubble_fraction(8, 24) == pytest.approx(7 / 31)
    assert bubble_fraction(8, 24, 2) == pytest.approx(7 / 55)


def test_unknown_schedule_lists_allowed():
    with pytest.raises(ValueError, match="gpipe, 1f1b, interleaved_1f1b"):
        schedule("zb", 2, 2, 0)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 4, 2), (2, 6, 3), (8, 16, 2), (3, 9, 4)])
def test_interleaved_receives_are_posted_one_pass_ahead_as_megatron_does(p, m, v):
    for s in range(p):
        steps = interleaved_1f1b(p, m, s, v)
        posts = recv_posts(steps, p, v, s)
        posted = sorted(i for idxs in posts.values() for i in idxs)
        # every pass with an input from another stage, once: forwards but the first virtual stage's (chunk 0
        # of stage 0), backwards but the last one's (chunk v-1 of stage p-1)
        expected = m * v - (m if s == 0 else 0) + m * v - (m if s == p - 1 else 0)
        assert len(posted) == len(set(posted)) == expected
        warmup = min((p - s - 1) * 2 + (v - 1) * p, m * v)
        first_b = next(i for i, st in enumerate(steps) if st.kind == "B")
        for after, idxs in posts.items():
            for i in idxs:
                kind = steps[i].kind
                earlier = [j for j in range(i) if steps[j].kind == kind]
                if earlier:  # right after the previous pass of its kind
                    assert after == earlier[-1]
                elif kind == "B":  # the first backward's: after the last warm-up forward
                    assert i == first_b and after == warmup - 1
                else:
                    assert after == -1
                # never more than one other pass between the post and the pass (the steady state's)
                assert 1 <= i - after <= 2


def test_recv_posts_rejects_an_unknown_step_kind():
    with pytest.raises(ValueError, match="step 0: kind must be F or B, got 'W'"):
        recv_posts([Step("W", 0)], 2, 1, 0)
