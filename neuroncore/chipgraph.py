"""Geometry of the chip graphs Neuron instances are wired as: rings and 2D tori (neuroncore.md §1.2).

Pure functions of the shape, in *local* device indices; ``neuroncore.topology`` turns them into
links and channels. Channel ids here are ``2 * link + direction`` (0 = a -> b, 1 = b -> a) with the
link numbering of ``ring_links`` / ``torus_links``.
"""

from __future__ import annotations


def ring_links(n: int) -> list[tuple[int, int]]:
    """Link i joins device i and i + 1 (mod n)."""
    return [(i, (i + 1) % n) for i in range(n)]


def ring_route(n: int, a: int, b: int) -> list[int]:
    """Local channel ids from a to b on a ring of n (link i = (i, i+1)); ties go forward."""
    forward = (b - a) % n
    if forward <= n - forward:
        return [2 * ((a + i) % n) for i in range(forward)]
    return [2 * ((a - i - 1) % n) + 1 for i in range(n - forward)]


def torus_links(rows: int, cols: int) -> list[tuple[int, int]]:
    """Device d = cols * r + c has link 2d to its right neighbour and 2d + 1 to the one below."""
    out = []
    for d in range(rows * cols):
        r, c = divmod(d, cols)
        out.append((d, r * cols + (c + 1) % cols))
        out.append((d, ((r + 1) % rows) * cols + c))
    return out


def torus_route(rows: int, cols: int, a: int, b: int) -> list[int]:
    """Dimension-ordered shortest path: along the row, then along the column; ties go forward."""
    ra, ca = divmod(a, cols)
    rb, cb = divmod(b, cols)
    out = []
    forward = (cb - ca) % cols
    if forward <= cols - forward:
        out += [2 * (2 * (ra * cols + (ca + i) % cols)) for i in range(forward)]
    else:
        out += [2 * (2 * (ra * cols + (ca - i - 1) % cols)) + 1 for i in range(cols - forward)]
    down = (rb - ra) % rows
    if down <= rows - down:
        out += [2 * (2 * (((ra + i) % rows) * cols + cb) + 1) for i in range(down)]
    else:
        out += [2 * (2 * (((ra - i - 1) % rows) * cols + cb) + 1) + 1 for i in range(rows - down)]
    return out


def torus_cycles(rows: int, cols: int) -> tuple[tuple[int, ...], ...]:
    """Two link-disjoint Hamiltonian cycles of a rows x cols torus (rows a multiple of cols).

    The first is a staircase: each row is walked cols - 1 steps to the right, then one step down,
    each row starting one column further left. The links it leaves unused form the second cycle
    (checked here; on the 4x4 torus the two cycles cover all 32 links)."""
    if rows % cols:
        raise ValueError(f"no staircase Hamiltonian cycle on a {rows}x{cols} torus")
    first: list[int] = []
    start = 0
    for r in range(rows):
        first += [r * cols + (start + i) % cols for i in range(cols)]
        start = (start - 1) % cols
    used = {frozenset((first[i], first[(i + 1) % len(first)])) for i in range(len(first))}
    rest: dict[int, list[int]] = {d: [] for d in range(rows * cols)}
    for a, b in torus_links(rows, cols):
        if frozenset((a, b)) not in used:
            rest[a].append(b)
            rest[b].append(a)
    second, prev = [0], None
    while all(len(v) == 2 for v in rest.values()):
        here = second[-1]
        step = min(rest[here]) if prev is None else next(d for d in rest[here] if d != prev)
        if step == 0:
            break
        prev = here
        second.append(step)
    if len(second) != rows * cols:
        return (tuple(first),)
    return (tuple(first), tuple(second))


def torus_connected(rows: int, cols: int, d: int) -> tuple[int, ...]:
    """neuron-ls order [up, left, down, right] (sys-tools.md §4.6: device 0 -> 12, 3, 4, 1)."""
    r, c = divmod(d, cols)
    return (((r - 1) % rows) * cols + c, r * cols + (c - 1) % cols,
            ((r + 1) % rows) * cols + c, r * cols + (c + 1) % cols)
