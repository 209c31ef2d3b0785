"""FriendlyCore: private averaging without a bound on the data, and k-means by k-tuple aggregation.

FriendlyCore framework after Tsfadia, Cohen, Kaplan, Mansour & Stemmer, "FriendlyCore: Practical Differentially
Private Aggregation" (ICML 2022); filter and analysis derived in this project. The paper's text was not available
here: the weight rule, the constants (2, 4r, 3, 8r, 6r), the release rule and every proof are ours, written out in
full in docs/friendlycore.md (cited below as "§n"). Nothing in this module is the paper's constant.

The mechanism, for a symmetric predicate f with f(x, z) => ||x - z|| <= r (§1):

  1. Soft core (§2): deg(x) = #{z in D : f(x, z)}, w(x) = clip(2 deg(x)/n - 1, 0, 1), W = sum w. No coins.
  2. Friendly average (§5): M = sum w(x) x / W. Under add/remove of one point,
        |W(D') - W(D)| <= (2n+1)/(n+1) < 2                           (Corollary 3.2, tight)
        ||M(D') - M(D)||_2 <= 4 r / max(W(D), W(D'))   if max(W, W') >= 2   (Theorem 5.1)
     (the design note's 3 and 6r, re-checked: both hold, both are loose; §10).
  3. Release, propose-test-release style (§6): W^ = W + N(0, (2 s_W)^2); L = W^ - z s_W' (z from delta', a
     sub-Gaussian tail, valid for OpenDP's discrete Gaussian); if L < L_min (>= 2) release "no friendly core"
     (None); else M^ = M + N(0, (s_M 4 r / L)^2 I). Theorem 6.1: with the noise multipliers of the plan this is
     (eps_0, delta_0 + delta')-DP for every (eps_0, delta_0) that rho-zCDP (rho = sum of the plan's rhos) converts
     to; `ptr_delta(params)` is the delta' the release must add to the delta it charges (§8).
  4. Radius (§7): a public r, or the smallest r of a public geometric grid whose noisy W reaches a public
     fraction of a noisy count, found by a binary search (ceil(log2 J) Gaussian probes of W, sensitivity 2).
  5. k-means (§9): records go to m (even, public) subsets by independent coins from a generator that is not
     published; non-private k-means++ on every subset gives m k-tuples; adding a record replaces one tuple, and
     the same weights then satisfy |dW| < 3 and ||dM|| < 8 r / max(W, W'') under replacement (Theorem 9.3,
     this is "group privacy 2" done on the statistics; m even is needed, Lemma 9.2). Tuple predicate: both
     tuples 6r-separated and the nearest-centre matching a bijection within r in Frobenius norm; on a friendly
     set the matchings are consistent (Lemma 9.5), so bucketing every core tuple's centres by the nearest
     centre of any core tuple gives the same k buckets; the k bucket averages are one friendly average in
     R^{k d} (one Gaussian release with one W^).

Noise and accounting go through `dpalgos.plan` / `dpalgos.noise`: every noisy value is drawn by
`measure(name, exact, bound=...)` for an entry of the plan built by `mean_plan(params)` / `kmeans_plan(params)`.
Public randomness (subset coins, k-means++ seeds) comes from a separate `np.random.Generator`.

Friend counts never build an n x n matrix for large n: `EuclideanFriends` works in row blocks (BLAS distances
used only where a rigorous rounding-error margin certifies the comparison, the defining formula elsewhere,
§12); `GridFriends` (d <= 3) counts a cell predicate by a histogram and a convolution in O(n + cells);
`PairFriends` counts any predicate given as a block function; `TupleFriends` is the k-means predicate.

The package follows the sections of the analysis, each module importing only those before it: `constants`,
`friends` (predicates and friend counts), `core` (soft core, friendly average, the PTR bound), `radius` (the grid and
its private choice), `refine` (the clipped sum of §13), `mean` (averaging: parameters, plan, release) and `kmeans`
(k-tuple aggregation). Start with `mean.friendly_mean`. Every name is re-exported here: `fc.<name>` reads as before.
"""

from __future__ import annotations

from dpalgos.friendlycore.constants import (
    COUNT_SENSITIVITY,
    MAX_RADIUS,
    MEAN_SENSITIVITY_MULTIPLE,
    PREDICATES,
    SEPARATION_FACTOR,
    TUPLE_MEAN_SENSITIVITY_MULTIPLE,
    TUPLE_WEIGHT_SENSITIVITY,
    WEIGHT_SENSITIVITY,
    check_radius,
)
from dpalgos.friendlycore.core import (
    PTR_ARGUMENT,
    gaussian_tail_z,
    mean_noise_scale,
    ptr_delta,
    ptr_lower_bound,
    soft_weights,
    total_weight,
    weighted_mean,
)
from dpalgos.friendlycore.friends import (
    EuclideanFriends,
    FriendCounter,
    GridFriends,
    PairFriends,
    euclidean_block_predicate,
    friend_counter,
    sq_dist_pairs,
)
from dpalgos.friendlycore.kmeans import (
    BATCH_FLOATS,
    LLOYD_PASSES,
    SUM_BLOCK,
    KMeansParams,
    KMeansRelease,
    TupleFriends,
    _batched_kmeans,
    _cluster_sums,
    _kmeanspp,
    _nearest,
    _seq_sum,
    _sq_dists,
    align_tuples,
    friendly_kmeans,
    friendly_kmeans_from_tuples,
    kmeans_plan,
    subset_tuples,
)
from dpalgos.friendlycore.mean import (
    MeanParams,
    MeanRelease,
    clip_radii,
    friendly_mean,
    mean_plan,
)
from dpalgos.friendlycore.radius import (
    SEARCH_MARGIN,
    RadiusGrid,
    binary_search_radius,
    search_threshold,
)
from dpalgos.friendlycore.refine import (
    clipped_sum,
    distances_to,
    refine_mean,
)

__all__ = ["BATCH_FLOATS", "COUNT_SENSITIVITY", "EuclideanFriends", "FriendCounter", "GridFriends", "KMeansParams",
           "KMeansRelease", "LLOYD_PASSES", "MAX_RADIUS", "MEAN_SENSITIVITY_MULTIPLE", "MeanParams",
           "MeanRelease", "PREDICATES", "PTR_ARGUMENT", "PairFriends", "RadiusGrid", "SEARCH_MARGIN",
           "SEPARATION_FACTOR", "SUM_BLOCK", "TUPLE_MEAN_SENSITIVITY_MULTIPLE", "TUPLE_WEIGHT_SENSITIVITY",
           "TupleFriends", "WEIGHT_SENSITIVITY", "_batched_kmeans", "_cluster_sums", "_kmeanspp", "_nearest",
           "_seq_sum", "_sq_dists", "align_tuples", "binary_search_radius", "check_radius", "clip_radii",
           "clipped_sum", "distances_to", "euclidean_block_predicate", "friend_counter", "friendly_kmeans",
           "friendly_kmeans_from_tuples", "friendly_mean", "gaussian_tail_z", "kmeans_plan",
           "mean_noise_scale", "mean_plan", "ptr_delta", "ptr_lower_bound", "refine_mean", "search_threshold",
           "soft_weights", "sq_dist_pairs", "subset_tuples", "total_weight", "weighted_mean"]


