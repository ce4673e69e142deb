"""Helix fits of sets of hits from summed moments: how well two pieces of track continue each other.

A charged particle from the beam line in a solenoid draws, in x-y, a circle through the origin,
and in (s, z) a line, s the arc length. Both fits are linear least squares, so a hit set's fit
needs only sums over its hits (``hit_moments``), and the fit of two sets together is the fit of
their summed moments (``residuals``): no hit is visited twice.

- Circle through the origin, centre c: minimise sum (2 p.c - |p|^2)^2 over hits p (the algebraic
  distance, which is 2R times the geometric one near the circle). A straight line through the
  origin (infinite momentum) is the limit; its residual is the smaller eigenvalue of the
  hits' x-y second moments, and the smaller of the two residuals is taken.
- Line z = z0 + t s, with s = r + r^3 / (24 R^2) (arc length to third order in r / R, R from the
  circle), so that low-pT particles curling over a metre do not bend their own z line.

Lengths in mm. Public symbols: ``MOMENTS``, ``hit_moments``, ``residuals``.
"""

from __future__ import annotations

import numpy as np

# The summed quantities, in column order.
MOMENTS = (
    "n", "xx", "xy", "yy", "xr2", "yr2", "r4",  # circle through the origin
    "r", "r2", "r3", "r6", "z", "rz", "r3z", "zz",  # z line against the arc length
)  # fmt: skip


def hit_moments(group: np.ndarray, xyz: np.ndarray, num_groups: int) -> np.ndarray:
    """Sums of ``MOMENTS`` over the hits of each group.

    Args:
      group: int [H], group (e.g. track candidate) of each hit, 0 .. num_groups - 1.
      xyz: float [H, 3], hit positions (mm).
      num_groups: G.

    Returns:
      float64 [G, len(MOMENTS)].
    """
    x, y, z = np.asarray(xyz, np.float64).T
    r2 = x * x + y * y
    r = np.sqrt(r2)
    terms = (
        np.ones_like(x), x * x, x * y, y * y, x * r2, y * r2, r2 * r2,
        r, r2, r * r2, r2 * r2 * r2, z, r * z, r * r2 * z, z * z,
    )  # fmt: skip
    return np.stack([np.bincount(group, t, minlength=num_groups) for t in terms], axis=1)


def residuals(moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RMS residuals of the helix fit of each row of summed moments.

    Args:
      moments: float64 [K, len(MOMENTS)] (sums of ``hit_moments`` rows).

    Returns:
      (transverse, longitudinal): float64 [K] RMS distance (mm) of the hits from the fitted
      circle (or straight line) in x-y, and from the fitted line in (s, z); NaN where the hits
      cannot fix a fit (fewer than 3 hits, or all at one radius).
    """
    n, xx, xy, yy, xr2, yr2, r4, r, r2, r3, r6, z, rz, r3z, zz = moments.T
    det = xx * yy - xy * xy
    trace = xx + yy
    curved = det > 1e-12 * trace * trace
    safe = np.where(curved, det, 1.0)
    # Centre c = A^-1 b / 2 with A the x-y second moments and b = (sum x r^2, sum y r^2).
    cx = (yy * xr2 - xy * yr2) / safe / 2
    cy = (xx * yr2 - xy * xr2) / safe / 2
    rss = r4 - 4 * (cx * xr2 + cy * yr2) + 4 * (cx * cx * xx + 2 * cx * cy * xy + cy * cy * yy)
    radius = np.where(curved, np.hypot(cx, cy), np.inf)
    circle = np.where(curved, np.sqrt(np.maximum(rss, 0) / n) / (2 * radius), np.inf)
    line = np.sqrt(np.maximum(trace / 2 - np.sqrt(np.maximum(trace**2 / 4 - det, 0)), 0) / n)
    transverse = np.minimum(circle, line)
    radius = np.where(line < circle, np.inf, radius)
    # z = z0 + t s, s = r + k r^3: moments of s from those of r.
    k = 1 / (24 * radius * radius)
    s, ss, sz = r + k * r3, r2 + 2 * k * r4 + k * k * r6, rz + k * r3z
    spread = n * ss - s * s
    ok = spread > 1e-9 * np.maximum(ss, 1)
    spread = np.where(ok, spread, 1.0)
    t = (n * sz - s * z) / spread
    z0 = (z - t * s) / n
    zrss = zz - 2 * z0 * z - 2 * t * sz + n * z0 * z0 + 2 * z0 * t * s + t * t * ss
    longitudinal = np.sqrt(np.maximum(zrss, 0) / n)
    enough = (n >= 3) & ok
    return np.where(enough, transverse, np.nan), np.where(enough, longitudinal, np.nan)
