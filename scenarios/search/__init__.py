"""``trainsim search``: the best parallel plan for a model on a cluster, under memory limits.

:mod:`~scenarios.search.space` enumerates the plans and says why the invalid ones are;
:mod:`~scenarios.search.screen` estimates every plan analytically (tier 1, :func:`screen`);
:mod:`~scenarios.search.simulate` co-simulates the best (tier 2) through a ``concurrent.futures``
executor with a resumable cache; :mod:`~scenarios.search.report` ranks, tabulates and writes them.
"""

from scenarios.search.screen import Estimate, ScreenContext, screen
from scenarios.search.space import Candidate, Rejection, enumerate_space, parse_knobs

__all__ = ["Candidate", "Estimate", "Rejection", "ScreenContext", "enumerate_space", "parse_knobs", "screen"]
