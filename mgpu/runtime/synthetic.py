"""The course's offline default dataset: generated images with Fashion-MNIST's shape.

Public datasets cannot be downloaded on the course machines, so every notebook can fall back on
this set instead. :func:`generate` returns ``(x_train, y_train, x_test, y_test)`` exactly like
``keras.datasets.fashion_mnist.load_data()`` (uint8 images of shape ``(n, 28, 28)``, uint8
labels 0..9), but draws them procedurally from a seed, in pure numpy, in a few seconds.

It is meant to be a real learning problem, not a toy: each class is a shape drawn with random
pose (translation, rotation, anisotropic scale), stroke width, contrast, occlusion, background
clutter and pixel noise. Several classes share a global silhouette and differ only in local
texture (plain / striped / checked disc; ring / dashed ring), so a linear model on pixels stays
well below a small CNN, and texture strength sometimes fades to almost nothing, so some samples
are genuinely ambiguous and no model reaches 100%.

Determinism: the same seed gives byte-identical arrays on any machine. The generator only uses
the raw bit stream of ``numpy.random.PCG64`` seeded through ``SeedSequence`` (numpy keeps bit
generator streams stable across versions, unlike ``Generator`` methods), turned into uniform
numbers with integer shifts, and IEEE-exact arithmetic (``+ - * /``, ``sqrt``, ``floor``,
``abs``, ``min``/``max``): no transcendental functions (whose SIMD versions may differ in the
last bit between CPUs), no reductions, no BLAS, nothing thread dependent. Rotations use the
rational parametrisation ``cos = (1-t^2)/(1+t^2)``, ``sin = 2t/(1+t^2)``, and periodic textures
use triangle waves built from ``floor``.

The data is generated in fixed-size chunks, each from its own random stream derived from
``(seed, split, chunk index)``. Hence the train and test splits are independent of each other
(changing ``n_train`` never changes the test split, and vice versa), a smaller split is a prefix
of a larger one, and peak memory stays modest whatever the size. Labels are balanced within
every block of 10 consecutive samples, so any prefix is balanced to within one sample per class.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CLASS_NAMES", "generate", "generate_private"]

CLASS_NAMES: tuple[str, ...] = (
    "disc",
    "striped disc",
    "checked disc",
    "ring",
    "dashed ring",
    "cross",
    "box",
    "triangle",
    "crescent",
    "zigzag",
)

_SIZE = 28
_CHUNK = 1000  # samples per random stream; a multiple of 10 so full chunks are exactly balanced
_ENTROPY = 0x6D677075  # fixed tag mixed into every stream (b"mgpu"), so seeds map to our own streams
_TRAIN, _TEST, _PRIVATE = 0, 1, 2
_PIX = 0.1  # one pixel in the canonical coordinates the shapes are drawn in (image spans +-1.35)
_N_PARAMS = 36  # uniform draws per sample; every class reads the columns it needs

# Pixel centres in canonical coordinates, flattened row-major: shape (1, 784).
_X = np.tile((np.arange(_SIZE, dtype=np.float32) - 13.5) * np.float32(_PIX), _SIZE)[None, :]
_Y = np.repeat((np.arange(_SIZE, dtype=np.float32) - 13.5) * np.float32(_PIX), _SIZE)[None, :]


# --------------------------------------------------------------------------------------------
# Small exact helpers (all elementwise, all IEEE-exact operations)
# --------------------------------------------------------------------------------------------


def _between(p: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Map uniform draws in [0, 1) to [lo, hi), as float32 columns ready to broadcast."""
    return (lo + (hi - lo) * p).astype(np.float32)


def _soft(d: np.ndarray, width: float = 1.2 * _PIX) -> np.ndarray:
    """Anti-aliased inside test for a signed distance ``d`` (negative inside): 1 in, 0 out."""
    return np.clip(0.5 - d * np.float32(1.0 / width), 0.0, 1.0)


def _tri(t: np.ndarray) -> np.ndarray:
    """Triangle wave of period 1 with values in [0, 1] (a cos substitute without cos)."""
    return np.abs(2.0 * (t - np.floor(t)) - 1.0)


def _square(t: np.ndarray, duty: np.ndarray, sharp: float = 6.0) -> np.ndarray:
    """Soft square wave of period 1: about 1 on a ``duty`` fraction of the period, else 0."""
    return np.clip((_tri(t) - (1.0 - duty)) * np.float32(sharp) + 0.5, 0.0, 1.0)


def _rot(p: np.ndarray, t_max: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of a random angle in +-2*atan(``t_max``) (rational parametrisation, exact ops)."""
    t = (2.0 * p - 1.0) * t_max
    cos, sin = (1.0 - t * t) / (1.0 + t * t), 2.0 * t / (1.0 + t * t)
    return cos.astype(np.float32), sin.astype(np.float32)


def _direction(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A random unit vector in any direction (not exactly uniform in angle; it need not be)."""
    a, b = 2.0 * p - 1.0, 2.0 * q - 1.0
    norm = np.sqrt(a * a + b * b) + 1e-9
    return (a / norm).astype(np.float32), (b / norm).astype(np.float32)


def _segment(px, py, ax, ay, bx, by) -> np.ndarray:
    """Distance from points (px, py) to the segments from (ax, ay) to (bx, by)."""
    dx, dy = bx - ax, by - ay
    qx, qy = px - ax, py - ay
    h = np.clip((qx * dx + qy * dy) / (dx * dx + dy * dy + np.float32(1e-6)), 0.0, 1.0)
    ex, ey = qx - h * dx, qy - h * dy
    return np.sqrt(ex * ex + ey * ey)


def _ellipse(u, v, a, b) -> np.ndarray:
    """Approximate signed distance to an axis-aligned ellipse with half-axes a, b."""
    return (np.sqrt((u / a) * (u / a) + (v / b) * (v / b)) - 1.0) * np.minimum(a, b)


# --------------------------------------------------------------------------------------------
# The ten classes. Each takes object-frame coordinates u, v of shape (m, 784) and the matching
# rows of the parameter matrix (m, _N_PARAMS) of uniform draws; columns 8..15 are the class's
# own, 6 is the stroke width. Each returns intensities in [0, 1], shape (m, 784).
# Columns shared by all classes (see _render_chunk): 0-1 centre, 2 rotation, 3-4 scale,
# 5 clutter brightness, 7 contrast, 19 noise level, 20-23 occlusion, 24-35 two clutter strokes.
# --------------------------------------------------------------------------------------------


def _disc_body(u, v, p, half_u, half_v):
    a = _between(p[:, 8:9], *half_u)
    b = _between(p[:, 9:10], *half_v)
    shade = 1.0 - _between(p[:, 10:11], -0.25, 0.25) * u - _between(p[:, 11:12], -0.25, 0.25) * v
    return _soft(_ellipse(u, v, a, b)) * np.clip(shade, 0.0, 1.0)


def _texture_strength(p):
    # Occasionally faint: such samples are truly ambiguous with the untextured sibling class.
    return _between(p[:, 12:13], 0.0, 0.75)


# The three discs (and the two rings) overlap in size and shape, like shirts and T-shirts: the
# silhouette alone only partly tells them apart, the local texture does.
def _disc(u, v, p):
    return _disc_body(u, v, p, (0.6, 0.92), (0.6, 0.92))


def _striped_disc(u, v, p):
    period = _between(p[:, 13:14], 3.0 * _PIX, 5.0 * _PIX)
    phase = p[:, 14:15].astype(np.float32)
    stripes = _square(v / period + phase, _between(p[:, 15:16], 0.35, 0.6))
    body = _disc_body(u, v, p, (0.75, 1.05), (0.55, 0.85))
    return body * (1.0 - _texture_strength(p) * stripes)


def _checked_disc(u, v, p):
    period = _between(p[:, 13:14], 4.0 * _PIX, 6.0 * _PIX)
    s1 = _square(u / period + p[:, 14:15].astype(np.float32), np.float32(0.5))
    s2 = _square(v / period + p[:, 15:16].astype(np.float32), np.float32(0.5))
    checks = s1 + s2 - 2.0 * s1 * s2  # soft xor
    body = _disc_body(u, v, p, (0.55, 0.85), (0.75, 1.05))
    return body * (1.0 - _texture_strength(p) * checks)


def _ring_dist(u, v, p, radii):
    radius = _between(p[:, 8:9], *radii)
    width = _between(p[:, 6:7], 1.6 * _PIX, 3.2 * _PIX)
    r = np.sqrt(u * u + v * v)
    return np.abs(r - radius) - 0.5 * width, r


def _ring(u, v, p):
    d, _ = _ring_dist(u, v, p, (0.5, 0.82))
    return _soft(d)


def _dashed_ring(u, v, p):
    d, r = _ring_dist(u, v, p, (0.62, 0.95))
    # cos(n * angle) = T_n(u / r), Chebyshev recurrence; n from 4 to 7 dashes.
    c = u / (r + np.float32(1e-6))
    n = (4 + np.floor(p[:, 9:10] * 4)).astype(np.int64)
    t_prev, t_cur = np.ones_like(c), c
    cos_n = np.zeros_like(c)
    for k in range(2, 8):
        t_prev, t_cur = t_cur, 2.0 * c * t_cur - t_prev
        cos_n = np.where(n == k, t_cur, cos_n)
    gaps = np.clip(cos_n * np.float32(3.0) - _between(p[:, 10:11], -0.5, 1.5), 0.0, 1.0)
    return _soft(d) * (1.0 - _texture_strength(p) * 1.15 * gaps).clip(0.0, 1.0)


def _cross(u, v, p):
    arm_h = _between(p[:, 8:9], 0.55, 0.95)
    arm_v = _between(p[:, 9:10], 0.55, 0.95)
    width = _between(p[:, 6:7], 1.8 * _PIX, 3.5 * _PIX)
    au, av = np.abs(u), np.abs(v)
    horizontal = np.maximum(au - arm_h, av - 0.5 * width)
    vertical = np.maximum(av - arm_v, au - 0.5 * width)
    return _soft(np.minimum(horizontal, vertical))


def _box(u, v, p):
    half_u = _between(p[:, 8:9], 0.5, 0.85)
    half_v = _between(p[:, 9:10], 0.5, 0.85)
    width = _between(p[:, 6:7], 1.6 * _PIX, 3.2 * _PIX)
    d = np.maximum(np.abs(u) - half_u, np.abs(v) - half_v)
    return _soft(np.abs(d) - 0.5 * width)


def _triangle(u, v, p):
    size = _between(p[:, 8:9], 0.75, 1.05)
    skew = _between(p[:, 9:10], -0.25, 0.25)
    # Three half-planes: base at v = size/2, slanted sides meeting at (skew, -size).
    base = v - 0.5 * size
    left = (-(v + size) * 0.5 - (u - skew)) * np.float32(0.8944)  # 1 / sqrt(1.25)
    right = (-(v + size) * 0.5 + (u - skew)) * np.float32(0.8944)
    return _soft(np.maximum(base, np.maximum(left, right)))


def _crescent(u, v, p):
    radius = _between(p[:, 8:9], 0.65, 0.95)
    shift = _between(p[:, 9:10], 0.3, 0.6)
    inner = radius * _between(p[:, 10:11], 0.8, 1.0)
    outer_d = np.sqrt(u * u + v * v) - radius
    cut_d = np.sqrt((u - shift) * (u - shift) + v * v) - inner
    return _soft(np.maximum(outer_d, -cut_d))


def _zigzag(u, v, p):
    length = _between(p[:, 8:9], 0.7, 1.0)
    amp = _between(p[:, 9:10], 0.2, 0.45)
    period = _between(p[:, 10:11], 0.45, 0.8)
    width = _between(p[:, 6:7], 1.6 * _PIX, 3.0 * _PIX)
    wave = amp * (2.0 * _tri(u / period + p[:, 11:12].astype(np.float32)) - 1.0)
    # |v - wave| over-estimates the distance on the slopes; good enough for a stroke.
    d = np.maximum(np.abs(v - wave) - 0.5 * width, np.abs(u) - length)
    return _soft(d)


_CLASSES = (
    _disc,
    _striped_disc,
    _checked_disc,
    _ring,
    _dashed_ring,
    _cross,
    _box,
    _triangle,
    _crescent,
    _zigzag,
)
assert len(_CLASSES) == len(CLASS_NAMES) == 10


# --------------------------------------------------------------------------------------------
# Chunk rendering
# --------------------------------------------------------------------------------------------


def _uniform64(bits: np.random.PCG64, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform float64 in [0, 1) from the raw PCG64 stream (53 bits per draw)."""
    raw = bits.random_raw(int(np.prod(shape)))
    return ((raw >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(shape)


def _uniform32_pair(bits: np.random.PCG64, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 arrays uniform in [0, 1), 24 bits each, from one raw 64-bit draw per element."""
    raw = bits.random_raw(int(np.prod(shape)))
    hi = (raw >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
    lo = ((raw >> np.uint64(8)) & np.uint64(0xFFFFFF)).astype(np.float32) * np.float32(2.0**-24)
    return hi.reshape(shape), lo.reshape(shape)


def _render_chunk(bits: np.random.PCG64) -> tuple[np.ndarray, np.ndarray]:
    """One chunk of _CHUNK images and labels, drawn from ``bits`` in a fixed order.

    Only the raw PCG64 stream is used (numpy keeps bit generators' streams stable across
    versions, unlike ``Generator`` methods), turned into numbers with exact integer arithmetic.
    """
    n = _CHUNK
    # Draw everything up front, in an order that does not depend on the labels.
    # Labels: every block of 10 holds each class once, in a random order (stable argsort of
    # random keys: ties, if any, are broken the same way by every sort implementation).
    keys = _uniform64(bits, (n // 10, 10))
    labels = np.argsort(keys, axis=1, kind="stable").astype(np.uint8).ravel()
    p = _uniform64(bits, (n, _N_PARAMS))
    noise = _uniform32_pair(bits, (n, _SIZE * _SIZE))

    # Pose: object frame (u, v) = scale^-1 * rotation^-1 * (pixel - centre).
    cx = _between(p[:, 0:1], -1.5 * _PIX, 1.5 * _PIX)
    cy = _between(p[:, 1:2], -1.5 * _PIX, 1.5 * _PIX)
    cos, sin = _rot(p[:, 2:3], 0.13)  # about +-15 degrees
    sx = _between(p[:, 3:4], 0.85, 1.15)
    sy = _between(p[:, 4:5], 0.85, 1.15)
    dx, dy = _X - cx, _Y - cy
    u = (cos * dx + sin * dy) / sx
    v = (cos * dy - sin * dx) / sy

    img = np.empty((n, _SIZE * _SIZE), dtype=np.float32)
    for c, draw in enumerate(_CLASSES):
        rows = np.flatnonzero(labels == c)
        img[rows] = draw(u[rows], v[rows], p[rows])

    # Occlusion: in about 30% of the samples a half-plane hides part of the object.
    oc, os_ = _direction(p[:, 20:21], p[:, 21:22])
    offset = _between(p[:, 22:23], 0.15, 0.6)
    occluded = (p[:, 23:24] < 0.3).astype(np.float32)
    keep = _soft(oc * dx + os_ * dy - offset, 2.0 * _PIX)
    img *= 1.0 - occluded * (1.0 - keep)

    # Contrast: foreground brightness varies a lot between samples.
    img *= _between(p[:, 7:8], 0.45, 1.0)

    # Clutter: up to two faint thin strokes anywhere in the frame.
    for k in (24, 30):
        ax, ay = _between(p[:, k : k + 1], -1.3, 1.3), _between(p[:, k + 1 : k + 2], -1.3, 1.3)
        turn_c, turn_s = _direction(p[:, k + 2 : k + 3], p[:, k + 3 : k + 4])
        length = _between(p[:, k + 4 : k + 5], 0.2, 0.8)
        present = (p[:, k + 5 : k + 6] < 0.5).astype(np.float32)
        seg = _segment(_X, _Y, ax, ay, ax + length * turn_c, ay + length * turn_s)
        clutter = present * _between(p[:, 5:6], 0.25, 0.6) * _soft(seg - 0.6 * _PIX)
        np.maximum(img, clutter, out=img)

    # Pixel noise: triangular (sum of two uniforms), per-sample strength.
    sigma = _between(p[:, 19:20], 0.04, 0.18)
    img += sigma * (noise[0] + noise[1] - 1.0) * np.float32(2.45)  # 2.45 ~ sqrt(6): unit variance

    out = np.rint(np.clip(img, 0.0, 1.0) * np.float32(255.0)).astype(np.uint8)
    return out.reshape(n, _SIZE, _SIZE), labels


def _split(seed: int, split: int, n: int, secret: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` samples of one split's stream of chunks."""
    n_chunks = -(-n // _CHUNK)
    x = np.empty((n_chunks * _CHUNK, _SIZE, _SIZE), dtype=np.uint8)
    y = np.empty(n_chunks * _CHUNK, dtype=np.uint8)
    entropy = [_ENTROPY, seed] if secret is None else [_ENTROPY, seed, secret]
    for i in range(n_chunks):
        seq = np.random.SeedSequence(entropy=entropy, spawn_key=(split, i))
        sl = slice(i * _CHUNK, (i + 1) * _CHUNK)
        x[sl], y[sl] = _render_chunk(np.random.PCG64(seq))
    return x[:n], y[:n]


def generate(
    seed: int = 0, n_train: int = 60000, n_test: int = 10000
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate ``(x_train, y_train, x_test, y_test)`` like ``fashion_mnist.load_data()``.

    Images are uint8 arrays of shape ``(n, 28, 28)``, labels uint8 arrays of shape ``(n,)`` with
    values 0..9 naming :data:`CLASS_NAMES`. The same ``seed`` gives byte-identical arrays on every
    machine; the train and test splits come from independent random streams, and a smaller
    ``n_train`` (or ``n_test``) gives a prefix of the larger split.
    """
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    if n_train < 0 or n_test < 0:
        raise ValueError(f"sizes must be non-negative, got n_train={n_train}, n_test={n_test}")
    x_train, y_train = _split(seed, _TRAIN, int(n_train))
    x_test, y_test = _split(seed, _TEST, int(n_test))
    return x_train, y_train, x_test, y_test


def generate_private(secret: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` more samples of the same task as ``generate(seed)``, from a stream keyed by ``secret``.

    The shapes and the distribution of pose, texture and noise are those of every split; only the
    random stream differs. Whoever does not know ``secret`` (a 128-bit integer) cannot regenerate
    these samples, unlike the public test split: the grader measures on them.
    """
    secret = int(secret)
    if secret < 0 or n < 0:
        raise ValueError(f"secret and n must be non-negative, got secret<0={secret < 0}, n={n}")
    return _split(int(seed), _PRIVATE, int(n), secret=secret)
