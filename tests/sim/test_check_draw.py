"""The sample check's draw (``sim.evaluator.check.draw``) counted per arm rather than listed per arm: the same points."""

from __future__ import annotations

import random

from sim.evaluator.check import ARM_N, draw


def _listed(arms: list[str], n: int, seed: int) -> set[int]:
    """The draw as it was written: every arm's points listed, then each short arm topped up."""
    rng = random.Random(seed)
    chosen = set(rng.sample(range(len(arms)), min(n, len(arms))))
    by_arm: dict[str, list[int]] = {}
    for i, arm in enumerate(arms):
        by_arm.setdefault(arm, []).append(i)
    for arm in sorted(by_arm):
        mine = [i for i in by_arm[arm] if i not in chosen]
        short = min(ARM_N, n) - (len(by_arm[arm]) - len(mine))
        if short > 0 and mine:
            chosen |= set(rng.sample(mine, min(short, len(mine))))
    return chosen


def test_the_draw_is_the_listed_draw() -> None:
    """Over random arm lists (one arm, a rare arm, a rare arm drawn enough by chance, three arms, fewer points than n,
    none), sizes and seeds, ``draw`` chooses exactly the points the listed draw chose."""
    rng = random.Random(3)
    cases = [([], 32), (["transport"] * 5, 32), (["resident"] * 3 + ["transport"] * 2, 4)]
    for _ in range(300):
        size = rng.choice([1, 7, 40, 200, 3000])
        weights = rng.choice([(1.0,), (0.99, 0.01), (0.9, 0.1), (0.5, 0.3, 0.2), (0.998, 0.001, 0.001)])
        names = ["transport", "resident", "other"][: len(weights)]
        cases.append((rng.choices(names, weights, k=size), rng.choice([0, 1, 8, 32, 100])))
    seen_top_up = False
    for arms, n in cases:
        for seed in (0, 1, 12345):
            want = _listed(arms, n, seed)
            assert draw(arms, n, seed) == want, (len(arms), n, seed)
            seen_top_up |= len(want) > min(n, len(arms))
    assert seen_top_up  # some short arm was topped up
