"""A synthetic top-down traffic video generator with anomalies, and a frame tracker.

:func:`generate_video` draws one seeded video as ``uint8 [T, H, W, 3]`` frames: a
two-lane road (top lane westbound, bottom lane eastbound, a dashed centre line),
sidewalks, grass and a zebra crosswalk at a random column; cars (6 x 3 px) drive
their lane at the lane's speed, pedestrians (2 x 2 px) walk the sidewalks and some
cross at the crosswalk. Every actor has its own colour from :data:`PALETTE`, so a
tracker can follow it. A video holds at most one anomaly (uniform over
:data:`EVENT_TYPES`, normal traffic included):

* ``collision``: a faster car catches up with the car ahead in its lane; from the
  contact frame both stand still, touching, until they are cleared (gone) after
  ``end``;
* ``wrong_way``: a car swerves into the oncoming lane and drives against its direction
  from ``start`` to ``end``, then returns to its lane;
* ``stalled``: a car stops in its lane from ``start`` to ``end`` and then drives on;
* ``jaywalking``: a pedestrian crosses the road away from the crosswalk; the event is
  the frames it is on the road.

The ground-truth event log gives the type, the actors (ids, kinds, colours) and the
start / end frame (inclusive). Anomalies start after frame 1 and end before the last
two frames, so the first and last frames of a video never show one. Actors that would
overlap another (except the colliding pair) are removed before rendering.

:func:`track_events` reads an event log back from the frames alone (colour blobs,
lane geometry): the upper bound that shows the labels are recoverable from pixels.
"""

from __future__ import annotations

import dataclasses

import numpy as np

EVENT_TYPES = ("normal", "collision", "wrong_way", "stalled", "jaywalking")
ANOMALIES = EVENT_TYPES[1:]
PALETTE = {  # name -> RGB; no background colour is in here
    "red": (220, 30, 30), "blue": (30, 60, 230), "orange": (250, 140, 0),
    "purple": (140, 40, 200), "cyan": (0, 210, 230), "magenta": (230, 0, 170),
    "lime": (150, 240, 0), "brown": (130, 70, 20), "pink": (255, 150, 190),
    "navy": (0, 0, 120), "teal": (0, 128, 128), "black": (10, 10, 10),
    "maroon": (120, 0, 30), "olive": (128, 128, 0), "violet": (200, 150, 255),
    "gold": (255, 215, 80),
}
BACKGROUND = {"grass": (60, 120, 60), "sidewalk": (170, 170, 170), "road": (80, 80, 80),
              "marking": (230, 200, 40), "crosswalk": (235, 235, 235)}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Pixel geometry of the scene (rows inclusive-exclusive)."""

    height: int = 48
    width: int = 64
    sidewalk_top: tuple = (14, 18)
    road: tuple = (18, 30)
    sidewalk_bottom: tuple = (30, 34)
    lane_rows: tuple = (19, 26)  # top row of a car in the westbound / eastbound lane
    car: tuple = (3, 6)  # height, width
    ped: int = 2
    crosswalk_width: int = 6


LAYOUT = Layout()
LANE_DIR = (-1, 1)  # westbound moves to smaller x, eastbound to larger x


@dataclasses.dataclass
class Actor:
    id: int
    kind: str  # "car" or "pedestrian"
    colour: str
    xy: np.ndarray  # [T, 2] float (x = left column, y = top row), NaN when absent

    def visible(self, t: int) -> bool:
        return bool(np.isfinite(self.xy[t, 0]))


def _box(a: Actor, t: int, lay: Layout):
    h, w = lay.car if a.kind == "car" else (lay.ped, lay.ped)
    x, y = np.round(a.xy[t]).astype(int)
    return y, y + h, x, x + w


def _overlap(a: Actor, b: Actor, t: int, lay: Layout, gap: int = 1) -> bool:
    if not (a.visible(t) and b.visible(t)):
        return False
    y0, y1, x0, x1 = _box(a, t, lay)
    v0, v1, u0, u1 = _box(b, t, lay)
    return y0 < v1 and v0 < y1 and x0 < u1 + gap and u0 < x1 + gap


def _on_screen(x: np.ndarray, width: int, w: int) -> np.ndarray:
    """Whether a box ``w`` wide at (rounded) column ``x`` has a pixel in view."""
    x = np.round(x)
    return (x > -w) & (x < width)


def _car_track(lane, speed, x_at, t_at, T, lay):
    """A car in ``lane`` at lane speed, at column ``x_at`` on frame ``t_at``."""
    t = np.arange(T, dtype=np.float64)
    x = x_at + LANE_DIR[lane] * speed * (t - t_at)
    xy = np.stack([x, np.full(T, float(lay.lane_rows[lane]))], 1)
    xy[~_on_screen(x, lay.width, lay.car[1])] = np.nan
    return xy


def generate_video(seed: int, event: str | None = None, *, n_frames: int = 48,
                   layout: Layout = LAYOUT, min_duration: int = 6,
                   max_duration: int = 12) -> tuple[np.ndarray, dict]:
    """``(frames uint8 [T, H, W, 3], log)`` for one seeded video.

    ``event``: one of :data:`EVENT_TYPES` (default: drawn uniformly from the seed). The
    log: ``{"type", "start", "end", "actors": [{"id", "kind", "colour", "role"}],
    "lane", "scene": {"cars", "pedestrians", "crosswalk", "speeds"}, "n_frames"}``;
    ``start`` / ``end`` are inclusive frame numbers (None for normal traffic)."""
    if event is not None and event not in EVENT_TYPES:
        raise ValueError(f"event={event!r}; expected one of {EVENT_TYPES}")
    if n_frames < 2 * max_duration or not 2 <= min_duration <= max_duration:
        raise ValueError(f"n_frames={n_frames}, durations {min_duration}..{max_duration}: "
                         "expected 2 <= min <= max and n_frames >= 2 * max_duration")
    rng = np.random.default_rng(seed)
    lay, T = layout, n_frames
    event = event or EVENT_TYPES[rng.integers(len(EVENT_TYPES))]
    colours = [str(c) for c in rng.permutation(list(PALETTE))]
    speeds = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    cw = int(rng.integers(8, lay.width - 8 - lay.crosswalk_width))
    actors: list[Actor] = []
    special: list[int] = []

    def add(kind, xy):
        if len(actors) >= len(colours):  # one colour per actor; the scene is full
            return None
        actors.append(Actor(len(actors), kind, colours[len(actors)], xy))
        return actors[-1].id

    duration = int(rng.integers(min_duration, max_duration + 1))
    start = int(rng.integers(2, T - 2 - duration))
    end = start + duration - 1
    lane = int(rng.integers(2))
    t = np.arange(T, dtype=np.float64)
    W, cw_w = lay.width, lay.car[1]
    if event == "stalled":
        x_s = float(rng.integers(8, W - 14))
        xy = _car_track(lane, speeds[lane], x_s, start, T, lay)
        moving_after = x_s + LANE_DIR[lane] * speeds[lane] * (t - end)
        xy[start:end + 1, 0] = x_s
        xy[end + 1:, 0] = moving_after[end + 1:]
        xy[:, 1] = lay.lane_rows[lane]
        xy[~_on_screen(xy[:, 0], W, cw_w)] = np.nan
        special = [add("car", xy)]
    elif event == "collision":
        d, v = LANE_DIR[lane], speeds[lane]
        fast = v + int(rng.integers(1, 3))
        x_c = float(rng.integers(14, W - 20))  # the leader's column at contact
        lead = _car_track(lane, v, x_c, start, T, lay)
        x_f = x_c - d * cw_w + fast * d * (t - start)
        foll = np.stack([x_f, np.full(T, float(lay.lane_rows[lane]))], 1)
        foll[~_on_screen(x_f, W, cw_w)] = np.nan
        for xy, x_stop in ((lead, x_c), (foll, x_c - d * cw_w)):
            xy[start:end + 1] = (x_stop, lay.lane_rows[lane])
            xy[end + 1:] = np.nan
        special = [add("car", foll), add("car", lead)]  # the striking car first
    elif event == "wrong_way":
        v = speeds[lane]
        # the car is in the oncoming lane from start to end, at a column where it is
        # fully on screen throughout
        d = LANE_DIR[lane]
        span = v * (duration - 1)
        lo, hi = (2 + span, W - cw_w - 2) if d < 0 else (2, W - cw_w - 2 - span)
        x_s = float(rng.integers(lo, max(lo + 1, hi)))
        xy = _car_track(lane, v, x_s, start, T, lay)
        xy[start:end + 1, 1] = lay.lane_rows[1 - lane]
        special = [add("car", xy)]
    elif event == "jaywalking":
        special = [add("pedestrian", _crossing(rng, lay, T, start, duration, cw, jaywalk=True))]
    # normal traffic: cars per lane at the lane speed, spaced so they never touch
    for ln in (0, 1):
        v = speeds[ln]
        x_in = W if LANE_DIR[ln] < 0 else -cw_w
        t0 = float(rng.uniform(-W / v, 0))
        while t0 < T:
            add("car", _car_track(ln, v, x_in, t0, T, lay))
            t0 += float(rng.uniform(14, 40)) / v
    for _ in range(int(rng.integers(1, 3))):  # sidewalk walkers
        top = bool(rng.integers(2))
        y = lay.sidewalk_top[0] + 1 if top else lay.sidewalk_bottom[0] + 1
        x = float(rng.uniform(0, W - 2)) + float(rng.choice([-0.5, 0.5])) * t
        xy = np.stack([x, np.full(T, float(y))], 1)
        xy[~_on_screen(x, W, lay.ped)] = np.nan
        add("pedestrian", xy)
    if rng.random() < 0.6:  # a lawful crossing at the crosswalk, as long as a jaywalk
        d0 = int(rng.integers(min_duration, max_duration + 1))
        s0 = int(rng.integers(2, T - 2 - d0))
        add("pedestrian", _crossing(rng, lay, T, s0, d0, cw, jaywalk=False))
    actors = [a for a in actors if a.id in special or np.isfinite(a.xy[:, 0]).any()]
    actors = _remove_conflicts(actors, special, lay, T, event)
    frames = render(actors, lay, T, cw)
    by_id = {a.id: a for a in actors}
    roles = {"collision": ["striking car", "struck car"], "wrong_way": ["wrong-way car"],
             "stalled": ["stalled car"], "jaywalking": ["jaywalker"]}.get(event, [])
    log = {"type": event, "start": None if event == "normal" else start,
           "end": None if event == "normal" else end,
           "lane": None if event in ("normal", "jaywalking") else ("westbound", "eastbound")[lane],
           "actors": [{"id": i, "kind": by_id[i].kind, "colour": by_id[i].colour, "role": r}
                      for i, r in zip(special, roles, strict=True)],
           "scene": {"cars": sum(a.kind == "car" for a in actors),
                     "pedestrians": sum(a.kind == "pedestrian" for a in actors),
                     "crosswalk": cw, "width": lay.width, "speeds": list(speeds)},
           "n_frames": T}
    return frames, log


def _crossing(rng, lay, T, start, duration, cw, *, jaywalk):
    """A pedestrian on the road exactly during ``start .. start + duration - 1``."""
    W, p = lay.width, lay.ped
    if jaywalk:  # at least 8 px clear of the crosswalk
        clear = cw + lay.crosswalk_width + 8
        choices = [x for x in range(2, W - 4) if x + p <= cw - 8 or x >= clear]
        x = float(rng.choice(choices))
    else:
        x = float(cw + rng.integers(0, lay.crosswalk_width - p + 1))
    down = bool(rng.integers(2))
    r0, r1 = lay.road
    # row of the top-left pixel: on the road (overlapping rows r0..r1-1) for `duration`
    # frames, from r0 - p + 1 to r1 - 1 (or back)
    rows = np.linspace(r0 - p + 1, r1 - 1, duration)
    if not down:
        rows = rows[::-1]
    y = np.empty(T)
    y[:start] = (r0 - p) if down else r1
    y[start:start + duration] = rows
    y[start + duration:] = r1 if down else (r0 - p)
    y = np.round(y)
    side = float(rng.choice([-0.5, 0.5]))
    xs = np.full(T, x)
    xs[:start] = x + side * (np.arange(start) - start)  # walks up to the crossing point
    xs[start + duration:] = x + side * (np.arange(start + duration, T) - start - duration + 1)
    xy = np.stack([xs, y], 1)
    xy[~_on_screen(xs, W, p)] = np.nan
    return xy


def _remove_conflicts(actors, special, lay, T, event):
    """Drops every non-event actor that ever touches another actor (the event's actors
    are kept; the colliding pair may touch each other)."""
    kept = [a for a in actors if a.id in special]
    for a in actors:
        if a.id in special:
            continue
        if not any(_overlap(a, b, t, lay) for b in kept for t in range(T)):
            kept.append(a)
    return sorted(kept, key=lambda a: a.id)


def background(lay: Layout, cw: int) -> np.ndarray:
    """The empty scene ``uint8 [H, W, 3]``."""
    img = np.empty((lay.height, lay.width, 3), np.uint8)
    img[:] = BACKGROUND["grass"]
    for r in (lay.sidewalk_top, lay.sidewalk_bottom):
        img[r[0]:r[1]] = BACKGROUND["sidewalk"]
    img[lay.road[0]:lay.road[1]] = BACKGROUND["road"]
    mid = (lay.road[0] + lay.road[1]) // 2 - 1  # the centre line, between the lanes
    for x in range(0, lay.width, 4):
        img[mid:mid + 1, x:x + 2] = BACKGROUND["marking"]
    for x in range(cw, cw + lay.crosswalk_width, 2):
        img[lay.road[0]:lay.road[1], x] = BACKGROUND["crosswalk"]
    return img


def render(actors, lay: Layout, T: int, cw: int) -> np.ndarray:
    """Frames ``uint8 [T, H, W, 3]`` of ``actors`` over :func:`background`."""
    bg = background(lay, cw)
    frames = np.repeat(bg[None], T, 0)
    for t in range(T):
        for a in actors:
            if a.visible(t):
                y0, y1, x0, x1 = _box(a, t, lay)
                frames[t, max(y0, 0):y1, max(x0, 0):max(x1, 0)] = PALETTE[a.colour]
    return frames


# --- reading events back from the frames -------------------------------------------------


def blobs(frames: np.ndarray) -> dict[str, np.ndarray]:
    """``{colour: [T, 4]}`` bounding boxes ``(y0, y1, x0, x1)`` of each palette colour's
    pixels per frame (NaN where absent), for the colours that appear."""
    out = {}
    for name, rgb in PALETTE.items():
        mask = np.all(frames == np.asarray(rgb, np.uint8), axis=-1)  # [T, H, W]
        if not mask.any():
            continue
        box = np.full((len(frames), 4), np.nan)
        for t in np.nonzero(mask.any((1, 2)))[0]:
            ys, xs = np.nonzero(mask[t])
            box[t] = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        out[name] = box
    return out


def _runs(flags: np.ndarray, min_len: int = 1) -> list[tuple[int, int]]:
    runs, start = [], None
    for t, f in enumerate(list(flags) + [False]):
        if f and start is None:
            start = t
        elif not f and start is not None:
            if t - start >= min_len:
                runs.append((start, t - 1))
            start = None
    return runs


def _scene_objects(frames: np.ndarray, lay: Layout) -> tuple[dict, dict, int]:
    """``(boxes, kinds, crosswalk column)`` read from the frames: :func:`blobs`, each
    colour's kind (blobs 3 rows tall are cars, 2 rows tall pedestrians) and the zebra's
    first column (-100 when none is seen)."""
    boxes = blobs(frames)
    kinds = {c: "car" if np.nanmax(b[:, 1] - b[:, 0]) >= lay.car[0] else "pedestrian"
             for c, b in boxes.items()}
    zebra = np.all(frames[0, lay.road[0]] == BACKGROUND["crosswalk"], axis=-1)
    zebra_cols = np.nonzero(zebra)[0]
    return boxes, kinds, int(zebra_cols.min()) if len(zebra_cols) else -100


# What each actor is doing in a frame (actor_states).
STATES = ("car", "stopped", "wrong_way", "pedestrian", "jaywalker")
_CAR, _STOPPED, _WRONG_WAY, _PEDESTRIAN, _JAYWALKER = range(len(STATES))


def actor_states(frames: np.ndarray, layout: Layout = LAYOUT) -> dict[str, tuple]:
    """``{colour: (boxes [T, 4], state [T])}``: each actor's box per frame (as
    :func:`blobs`) and what it is doing there, an index into :data:`STATES` (-1 where it is
    absent), by :func:`track_events`' rules frame by frame: a car moving against its
    lane's direction is ``wrong_way``, a fully visible car that does not move between
    this frame and a neighbour is ``stopped``, a pedestrian on the road off the zebra is a
    ``jaywalker``."""
    lay, T = layout, len(frames)
    boxes, kinds, cw = _scene_objects(frames, lay)
    out = {}
    for c, b in boxes.items():
        seen = np.isfinite(b[:, 0])
        if kinds[c] == "pedestrian":
            on_road = (b[:, 1] > lay.road[0]) & (b[:, 0] < lay.road[1])
            off_zebra = (b[:, 3] <= cw) | (b[:, 2] >= cw + lay.crosswalk_width)
            state = np.where(on_road & off_zebra, _JAYWALKER, _PEDESTRIAN)
        else:
            lane = np.where(b[:, 0] == lay.lane_rows[0], 0,
                            np.where(b[:, 0] == lay.lane_rows[1], 1, -1))
            whole = (b[:, 3] - b[:, 2]) == lay.car[1]
            dx = np.sign(np.nan_to_num(np.diff(b[:, 2])))
            d = np.zeros(T)       # the motion into or out of each frame
            d[1:], d[:-1] = dx, np.where(dx != 0, dx, d[:-1])
            against = (lane >= 0) & (d == -np.asarray(LANE_DIR)[np.maximum(lane, 0)])
            still = np.zeros(T, bool)
            still[1:] = whole[1:] & whole[:-1] & (dx == 0)
            still[:-1] |= still[1:].copy()
            state = np.where(against, _WRONG_WAY, np.where(still, _STOPPED, _CAR))
        out[c] = (b, np.where(seen, state, -1))
    return out


def track_events(frames: np.ndarray, layout: Layout = LAYOUT) -> dict:
    """An event log estimated from the frames alone (the same keys as
    :func:`generate_video`'s, ``actors`` without ids): colour blobs 3 rows tall are cars,
    2 rows tall pedestrians; a car in the lane whose direction its motion opposes is
    wrong-way; two cars touching and still is a collision; a lone car still for 3+
    frames is stalled; a pedestrian on the road off the zebra is jaywalking."""
    lay, T = layout, len(frames)
    boxes, kinds, cw = _scene_objects(frames, lay)
    scene = {"cars": sum(k == "car" for k in kinds.values()),
             "pedestrians": sum(k == "pedestrian" for k in kinds.values()),
             "crosswalk": cw, "width": lay.width}
    found = []  # (type, start, end, [colours], lane)
    cars = [c for c in boxes if kinds[c] == "car"]
    full = {c: (boxes[c][:, 3] - boxes[c][:, 2]) == lay.car[1] for c in cars}
    steps = ([], [])  # per lane: |dx| of fully visible cars between frames in that lane
    for c in cars:
        b, f = boxes[c], full[c]
        for t in range(T - 1):
            if f[t] and f[t + 1] and b[t, 0] == b[t + 1, 0] and b[t + 1, 2] != b[t, 2]:
                steps[int(b[t, 0] != lay.lane_rows[0])].append(abs(b[t + 1, 2] - b[t, 2]))
    scene["speeds"] = [int(np.median(v)) if v else 1 for v in steps]
    for c in cars:
        b = boxes[c]
        lane = np.where(b[:, 0] == lay.lane_rows[0], 0,
                        np.where(b[:, 0] == lay.lane_rows[1], 1, -1))
        dx = np.diff(b[:, 2])
        for ln in (0, 1):
            # moving against lane ln's direction while in lane ln (either edge in view)
            wrong = np.zeros(T, bool)
            wrong[1:] = (lane[1:] == ln) & (np.sign(np.nan_to_num(dx)) == -LANE_DIR[ln])
            wrong[:-1] |= (lane[:-1] == ln) & (np.sign(np.nan_to_num(dx)) == -LANE_DIR[ln])
            wrong &= lane == ln
            for s, e in _runs(wrong, 2):
                found.append(("wrong_way", s, e, [c], ("westbound", "eastbound")[1 - ln]))
        still = np.zeros(T, bool)
        still[1:] = full[c][1:] & full[c][:-1] & (dx == 0)
        still[:-1] |= still[1:].copy()
        for s, e in _runs(still, 3):
            partner = [o for o in cars if o != c and all(
                np.isfinite(boxes[o][t, 0]) and boxes[o][t, 0] == b[t, 0]
                and (boxes[o][t, 3] == b[t, 2] or boxes[o][t, 2] == b[t, 3])
                for t in range(s, e + 1))]
            ln = ("westbound", "eastbound")[int(b[s, 0] != lay.lane_rows[0])]
            if partner:
                found.append(("collision", s, e, sorted([c, partner[0]]), ln))
            else:
                found.append(("stalled", s, e, [c], ln))
    for c in boxes:
        if kinds[c] != "pedestrian":
            continue
        b = boxes[c]
        on_road = (b[:, 1] > lay.road[0]) & (b[:, 0] < lay.road[1])
        off_zebra = (b[:, 3] <= cw) | (b[:, 2] >= cw + lay.crosswalk_width)
        for s, e in _runs(on_road & off_zebra, 1):
            found.append(("jaywalking", s, e, [c], None))
    if not found:
        return {"type": "normal", "start": None, "end": None, "lane": None, "actors": [],
                "scene": scene, "n_frames": T}
    # collisions are also two stalled cars: prefer the collision, then the longest event
    order = {"collision": 0, "wrong_way": 1, "jaywalking": 2, "stalled": 3}
    typ, s, e, cols, ln = min(found, key=lambda f: (order[f[0]], -(f[2] - f[1])))
    if typ == "collision":  # the striking car is the one that moved faster before contact
        speed = {c: abs(np.nanmean(np.diff(boxes[c][:s + 1, 2]))) if s > 1 else 0.0
                 for c in cols}
        cols = sorted(cols, key=lambda c: -np.nan_to_num(speed[c]))
    roles = {"collision": ["striking car", "struck car"], "wrong_way": ["wrong-way car"],
             "stalled": ["stalled car"], "jaywalking": ["jaywalker"]}[typ]
    return {"type": typ, "start": int(s), "end": int(e), "lane": ln,
            "actors": [{"kind": kinds[c], "colour": c, "role": r}
                       for c, r in zip(cols, roles, strict=True)],
            "scene": scene, "n_frames": T}
