"""A synthetic Taobao-display-ad world: users, ad groups and a planted click model.

The world (catalog, user profiles, latent factors, biases) depends only on the
seed and the scale; the impressions drawn from it depend on the seed and the
number of rows. Labels follow a logistic click model::

    logit = mu + item_bias[ad] + user_bias[user] + gain * <u_user, v_ad>
            + pid_effect[pid] - price_slope * log1p(price) + history_boost * [cate in history]

A clicked impression converts (``buy``) with a second logistic model, drawn after the
clicks from a generator of its own so that adding it left every other column as it was::

    logit = cvr_mu - cvr_price_slope * (log1p(price) - 4) + cvr_item_bias[ad]
            + shopping_gain * (shopping_level - 2) + pvalue_gain * (pvalue_level - 2)

About 5-15% of clicks convert: less often for dear items, more often for users of a
high shopping or pvalue level. The item term is drawn per ad group, independent of its
click bias, so the ID features carry conversion signal of their own; a row that is not
clicked never converts.

Item factors share a component with their category and user factors share a
component with their ``cms_group_id``, so side features carry part of the
signal and the ID features carry the rest: a model that can tell IDs apart
learns more than one whose IDs collide.

Large ID spaces use IDs in ``[1, size)``; small categorical fields use values in
``[0, num_buckets)`` of the Taobao example config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# Size of each large ID space at scale 1 (the Taobao display-ad dataset).
FULL_SPACES = {
    "user_id": 1_141_729,
    "adgroup_id": 846_811,
    "campaign_id": 423_437,
    "customer": 255_876,
    "brand": 461_497,
    "cate_id": 12_960,
}
MIN_SPACE = 16
PIDS = ("430548_1007", "430539_1007")
LATENT_DIM = 8
SEQUENCE_LIMIT = 50

_MU = -2.9
_GAIN = 2.2
_PID_EFFECT = np.array([0.0, -0.35])
_PRICE_SLOPE = 0.12
_HISTORY_BOOST = 0.6
_CVR_MU = -2.9
_CVR_PRICE_SLOPE = 0.6
_CVR_ITEM_SD = 0.6
_CVR_SHOPPING_GAIN = 0.5
_CVR_PVALUE_GAIN = 0.5


def space_sizes(scale: float) -> dict[str, int]:
    """ID space size per large field at ``scale`` (at least ``MIN_SPACE``)."""
    return {k: max(MIN_SPACE, int(round(v * scale))) for k, v in FULL_SPACES.items()}


def _zipf_weights(n: int, exponent: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    return w / w.sum()


def _ids_by_rank(rng: np.random.Generator, size: int) -> np.ndarray:
    """IDs in [1, size) in a random order: entry r is the ID of popularity rank r."""
    return rng.permutation(size - 1).astype(np.int64) + 1


def _sample_rank(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    """n popularity ranks drawn from a cumulative distribution."""
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), cdf.size - 1)


@dataclass
class Catalog:
    """Ad groups indexed by popularity rank (index 0 is the most shown)."""

    adgroup_id: np.ndarray
    cate_id: np.ndarray
    campaign_id: np.ndarray
    customer: np.ndarray
    brand: np.ndarray
    price: np.ndarray
    factor: np.ndarray  # (n, LATENT_DIM) float32
    bias: np.ndarray  # (n,) float32
    show_cdf: np.ndarray  # cumulative impression probability by rank


@dataclass
class Users:
    """User profiles indexed by ``user_id``; row 0 is unused."""

    profile: dict[str, np.ndarray]
    factor: np.ndarray  # (size, LATENT_DIM) float32
    bias: np.ndarray  # (size,) float32
    activity_ids: np.ndarray  # user IDs by activity rank
    activity_cdf: np.ndarray


def build_catalog(rng: np.random.Generator, spaces: dict[str, int]) -> Catalog:
    """Draw the ad-group catalog: each ad group has one cate/campaign/customer/brand."""
    n = spaces["adgroup_id"] - 1
    cate_ids = _ids_by_rank(rng, spaces["cate_id"])
    cate_of = cate_ids[_sample_rank(rng, np.cumsum(_zipf_weights(cate_ids.size, 1.1)), n)]
    campaign_ids = _ids_by_rank(rng, spaces["campaign_id"])
    campaign_rank = _sample_rank(rng, np.cumsum(_zipf_weights(campaign_ids.size, 0.6)), n)
    customer_ids = _ids_by_rank(rng, spaces["customer"])
    # A campaign belongs to one customer; a customer mostly sells one brand.
    customer_of_campaign = customer_ids[
        _sample_rank(rng, np.cumsum(_zipf_weights(customer_ids.size, 0.8)), campaign_ids.size)]
    brand_ids = _ids_by_rank(rng, spaces["brand"])
    brand_cdf = np.cumsum(_zipf_weights(brand_ids.size, 0.8))
    brand_of_customer = np.zeros(spaces["customer"], dtype=np.int64)
    brand_of_customer[customer_ids] = brand_ids[_sample_rank(rng, brand_cdf, customer_ids.size)]
    customer = customer_of_campaign[campaign_rank]
    own_brand = rng.random(n) < 0.7
    brand = np.where(own_brand, brand_of_customer[customer],
                     brand_ids[_sample_rank(rng, brand_cdf, n)])

    cate_factor = rng.standard_normal((spaces["cate_id"], LATENT_DIM)).astype(np.float32)
    cate_price = rng.normal(4.0, 1.0, spaces["cate_id"])
    price = np.maximum(np.round(np.exp(cate_price[cate_of] + rng.normal(0.0, 0.7, n)), 2), 0.01)
    factor = (0.6 * cate_factor[cate_of]
              + 0.8 * rng.standard_normal((n, LATENT_DIM)).astype(np.float32))
    factor /= np.float32(np.sqrt(LATENT_DIM))
    bias = rng.normal(0.0, 0.7, n).astype(np.float32)
    return Catalog(
        adgroup_id=_ids_by_rank(rng, spaces["adgroup_id"]), cate_id=cate_of,
        campaign_id=campaign_ids[campaign_rank], customer=customer, brand=brand,
        price=price, factor=factor, bias=bias,
        show_cdf=np.cumsum(_zipf_weights(n, 1.0)))


def build_users(rng: np.random.Generator, spaces: dict[str, int]) -> Users:
    """Draw profiles, latent factors and activity levels for every user ID."""
    size = spaces["user_id"]
    group = rng.integers(0, 13, size)
    profile = {
        "cms_segid": np.where(rng.random(size) < 0.6, 0, rng.integers(1, 98, size)),
        "cms_group_id": group,
        "final_gender_code": np.where(group < 6, 1, 2),
        "age_level": np.clip(group % 7, 0, 6),
        "pvalue_level": rng.choice(np.arange(1, 4), size, p=[0.3, 0.55, 0.15]),
        "shopping_level": rng.choice(np.arange(1, 4), size, p=[0.1, 0.2, 0.7]),
        "occupation": (rng.random(size) < 0.05).astype(np.int64),
        "new_user_class_level": rng.integers(1, 5, size),
    }
    profile = {k: v.astype(np.int64) for k, v in profile.items()}
    group_factor = rng.standard_normal((13, LATENT_DIM)).astype(np.float32)
    factor = (0.5 * group_factor[group]
              + 0.85 * rng.standard_normal((size, LATENT_DIM)).astype(np.float32))
    factor /= np.float32(np.sqrt(LATENT_DIM))
    bias = (rng.normal(0.0, 0.5, size) + 0.15 * (profile["shopping_level"] - 2)).astype(
        np.float32)
    return Users(profile=profile, factor=factor, bias=bias,
                 activity_ids=_ids_by_rank(rng, size),
                 activity_cdf=np.cumsum(_zipf_weights(size - 1, 0.7)))


def affinity(users: Users, catalog: Catalog, user: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Latent affinity <u_user, v_item> * gain, (n,) float32."""
    return _GAIN * np.einsum("ij,ij->i", users.factor[user], catalog.factor[rank])


def click_logit(users: Users, catalog: Catalog, user: np.ndarray, rank: np.ndarray,
                pid: np.ndarray, cate_seen: np.ndarray) -> np.ndarray:
    """Planted click logit of each impression (user ID, item rank, pid index, history hit)."""
    return (_MU + catalog.bias[rank] + users.bias[user] + affinity(users, catalog, user, rank)
            + _PID_EFFECT[pid] - _PRICE_SLOPE * np.log1p(catalog.price[rank])
            + _HISTORY_BOOST * cate_seen)


@dataclass
class Impressions:
    """Simulated impressions in time order (index = time)."""

    user: np.ndarray  # user IDs
    rank: np.ndarray  # catalog index of the shown ad group
    pid: np.ndarray  # index into PIDS
    clk: np.ndarray  # int64 0/1
    seq_offsets: np.ndarray  # (n + 1,) offsets into seq_rank
    seq_rank: np.ndarray  # catalog indices of the history, newest first per row
    buy: np.ndarray | None = None  # int64 0/1, set by with_conversions


def _prior_histories(rng: np.random.Generator, users: Users, catalog: Catalog,
                     user: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clicks made before the simulated window, chosen by each user's taste.

    Returns (user IDs, catalog indices, times): times run from -length to -1 per user,
    oldest first, so they sort before every impression of the window (times >= 0).
    """
    distinct = np.unique(user)
    length = np.where(rng.random(distinct.size) < 0.15, 0,
                      np.minimum(rng.geometric(1.0 / 12.0, distinct.size), SEQUENCE_LIMIT))
    owner = np.repeat(distinct, length)
    starts = np.cumsum(length) - length
    time = np.arange(owner.size) - np.repeat(starts + length, length)
    candidates = _sample_rank(rng, catalog.show_cdf, owner.size * 3).reshape(-1, 3)
    score = (affinity(users, catalog, np.repeat(owner, 3), candidates.ravel()).reshape(-1, 3)
             + catalog.bias[candidates] + rng.gumbel(size=candidates.shape))
    chosen = candidates[np.arange(owner.size), np.argmax(score, axis=1)]
    return owner, chosen, time


def _history_slices(ev_user, ev_time, user, num_rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort events by (user, time); return (order, start, end) of each row's last events."""
    span = np.int64(num_rows + SEQUENCE_LIMIT + 1)
    ev_key = ev_user * span + (ev_time + SEQUENCE_LIMIT + 1)
    order = np.argsort(ev_key, kind="stable")
    ev_key = ev_key[order]
    row_key = user * span + (np.arange(num_rows, dtype=np.int64) + SEQUENCE_LIMIT + 1)
    end = np.searchsorted(ev_key, row_key, side="left")
    first = np.searchsorted(ev_key, user * span, side="left")
    return order, np.maximum(first, end - SEQUENCE_LIMIT), end


def simulate(rng: np.random.Generator, users: Users, catalog: Catalog,
             num_rows: int) -> Impressions:
    """Draw ``num_rows`` impressions, their clicks and each user's click history."""
    user = users.activity_ids[_sample_rank(rng, users.activity_cdf, num_rows)]
    rank = _sample_rank(rng, catalog.show_cdf, num_rows)
    pid = (rng.random(num_rows) < 0.3).astype(np.int64)
    prior_user, prior_rank, prior_time = _prior_histories(rng, users, catalog, user)

    cate_space = np.int64(catalog.cate_id.max() + 1)
    seen = np.unique(prior_user * cate_space + catalog.cate_id[prior_rank])
    probe = user * cate_space + catalog.cate_id[rank]
    cate_seen = np.isin(probe, seen, assume_unique=False)
    logit = click_logit(users, catalog, user, rank, pid, cate_seen.astype(np.float32))
    clk = (rng.random(num_rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)

    clicked = np.flatnonzero(clk)
    ev_user = np.concatenate([prior_user, user[clicked]])
    ev_time = np.concatenate([prior_time, clicked]).astype(np.int64)
    ev_rank = np.concatenate([prior_rank, rank[clicked]])
    order, start, end = _history_slices(ev_user, ev_time, user, num_rows)
    lengths = end - start
    offsets = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    newest_first = np.repeat(end, lengths) - 1 - within
    return Impressions(user=user, rank=rank, pid=pid, clk=clk, seq_offsets=offsets,
                       seq_rank=ev_rank[order][newest_first])


def conversion_logit(users: Users, catalog: Catalog, user: np.ndarray, rank: np.ndarray,
                     item_bias: np.ndarray) -> np.ndarray:
    """Planted conversion logit of a clicked impression (user ID, item rank)."""
    return (_CVR_MU - _CVR_PRICE_SLOPE * (np.log1p(catalog.price[rank]) - 4.0)
            + item_bias[rank]
            + _CVR_SHOPPING_GAIN * (users.profile["shopping_level"][user] - 2)
            + _CVR_PVALUE_GAIN * (users.profile["pvalue_level"][user] - 2))


def with_conversions(rng: np.random.Generator, users: Users, catalog: Catalog,
                     imp: Impressions) -> Impressions:
    """``imp`` with its ``buy`` labels: clicked rows convert by :func:`conversion_logit`.

    ``rng`` draws only here (the item terms, then one uniform per row), so the clicks and
    everything else drawn before stay as they were.
    """
    item_bias = rng.normal(0.0, _CVR_ITEM_SD, catalog.price.size)
    logit = conversion_logit(users, catalog, imp.user, imp.rank, item_bias)
    draw = rng.random(imp.clk.size) < 1.0 / (1.0 + np.exp(-logit))
    return replace(imp, buy=(draw & (imp.clk == 1)).astype(np.int64))
