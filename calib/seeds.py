"""The one rule for seeds: which integers a trial, Stage-I or data seed may be, and the error that says so."""

from __future__ import annotations

from calib._config import ConfigError

__all__ = ["NUMPY_SEEDS", "SEED_LIMIT", "check_seed", "is_seed", "seed_rule"]


SEED_LIMIT = 2**32
"""Trial seeds are ``0 <= seed < SEED_LIMIT``: NumPy's global seed (``np.random.seed``) takes no other,
``np.random.default_rng`` takes no negative one, and torch's generators take the derived seeds
(``seed + 1_000_003``) of this range."""

NUMPY_SEEDS = "NumPy's seeding takes no other"
"""Why a seed is below :data:`SEED_LIMIT`, as the error says it."""


def is_seed(value: int) -> bool:
    """Whether ``value`` is a seed: ``0 <= value < SEED_LIMIT`` (2**32)."""
    return 0 <= value < SEED_LIMIT


def seed_rule(name: str, *, many: bool = False, why: str = NUMPY_SEEDS) -> str:
    """What the seed ``name`` (a key, or a flag: then its values are called ``seed``) must be, completing
    "`name` must ...": ``be an integer with 0 <= seed < 2**32 = 4294967296 (<why>)``."""
    variable = "seed" if name.startswith("-") else name
    return f"be {'integers' if many else 'an integer'} with 0 <= {variable} < 2**32 = {SEED_LIMIT} ({why})"


def check_seed(value: int, name: str, *, many: bool = False, why: str = NUMPY_SEEDS) -> None:
    """Raise :class:`ConfigError` "`name` must <:func:`seed_rule`>, got name=value." unless :func:`is_seed`."""
    if not is_seed(value):
        raise ConfigError(f"`{name}` must {seed_rule(name, many=many, why=why)}, got {name}={value!r}.")
