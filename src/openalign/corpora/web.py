"""A built-in web: pages on several hosts made from a corpus's training images, with what the real web has, and the
crawl of it (WARC and WAT) for `extract`; served on 127.0.0.1 for `fetch`.

    build(["data/emoji/train"], Path("web"))       web/web.json, web/sites/HOST/..., web/crawl/*.warc(.wat).gz,
                                                   web/planted.json (what was planted where: the tests' truth)
    with serve(Path("web")):                       every host on 127.0.0.1 at the port web.json gives it
        ...

Each training image appears on a page of an ordinary host (`h0`, `h1`, ...) with its caption as its alt-text (the
corpus's noisy titles), and the web adds, each listed in planted.json:
- `boilerplate`: alt-texts the web repeats ("image", "click here", "logo", ...), each on more images than
  `text_shared` allows (10), on small icons;
- `icons` (24 x 24) and `banners` (728 x 90): removed by `image_small` and `image_aspect` after the download;
- `missing_alt`: images without an alt attribute (extract drops them: no pair);
- `mirrored`: images served again under a second host's URL (the same bytes: one image to ingest);
(one training image in 20 of each kind, the rest ordinary)
- `private`: images under `/private/` on `h0`, whose robots.txt disallows that folder (never requested);
- `opted_out`: images on host `optout`, which answers with `X-Robots-Tag: noai`;
- `broken`: image links whose file is not there (404);
- `slow`: images on host `slow` (answers after 0.2-0.4 s) and `busy`: on host `busy` (429 with Retry-After: 1
  beyond 5 requests a second): both fetched in the end, politely.
The held-out split of a corpus is never read: give `build` the training shards only.
"""

from __future__ import annotations

import io
import json
import random
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated
from collections.abc import Iterator

from openalign.config import POSITIVE_INT, ConfigError, Options, Rule, non_negative
from openalign.corpora.hosts import Hosts, Site
from openalign.corpora.webpages import Image, Page, write_crawl
from openalign.data import images, tars
from openalign.outputs import write_json

BOILERPLATE = ("image", "click here", "logo", "photo", "banner")
SPECIAL_HOSTS = ("optout", "slow", "busy", "mirror")


@dataclass(frozen=True)
class WebOptions(Options):
    hosts: Annotated[int, POSITIVE_INT] = 4  # ordinary hosts (h0, h1, ...); optout, slow, busy and mirror besides
    per_page: Annotated[int, POSITIVE_INT] = 8  # images on a page
    port: Annotated[int, Rule(lambda x: 1 <= x <= 65_535, "a TCP port, 1 to 65535")] = 18_480  # the first host's
        # port on 127.0.0.1; the others follow it
    limit: Annotated[int, non_negative("0 (all) or more")] = 0  # at most this many training images (0: all)
    seed: int = 0  # the seed of every random choice: which pages, hosts and planted faults

    def cross_field_problems(self) -> list[str]:
        last = self.port + self.hosts + len(SPECIAL_HOSTS) - 1
        if last > 65_535:
            return [f"--port {self.port} with --hosts {self.hosts} needs ports up to {last:,} (one a host, "
                    f"{', '.join(SPECIAL_HOSTS)} besides), past 65535; choose a lower --port or fewer --hosts"]
        return []


def _png(size: tuple[int, int], color: tuple[int, int, int]) -> bytes:
    from PIL import Image as PILImage

    out = io.BytesIO()
    PILImage.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def build(shards: list[str], out: Path, options: WebOptions = WebOptions()) -> dict:
    """Writes the web under `out` from the training samples of `shards` (dirs or tar paths); returns planted.json."""
    out = Path(out)
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ConfigError(f"cannot build the web in {out}: {blocker} is a file; choose another --out")
    rng = random.Random(options.seed)
    found = [s for spec in shards if Path(spec).exists() for s in tars.list_shards(str(spec))]
    if not found:
        raise ConfigError(f"no webdataset shards in {', '.join(map(str, shards))}; give a corpus's training shards "
                          "(--from), or build the emoji corpus first: openalign corpus emoji --out data/emoji")
    samples = []
    for sample in tars.read_samples(found):
        try:
            data, texts = tars.image_bytes(sample), tars.sample_texts(sample)
        except tars.BadSample:
            continue
        try:
            suffix = images.EXTENSIONS.get(images.probe(data).format)
        except images.BadImage:
            continue
        if texts and suffix:
            samples.append((data, texts[0], suffix))
        if options.limit and len(samples) >= options.limit:
            break
    if not samples:
        raise ConfigError(f"the shards in {', '.join(map(str, shards))} hold no image with a caption")
    names = [f"h{k}" for k in range(options.hosts)] + list(SPECIAL_HOSTS)
    ports = {name: options.port + k for k, name in enumerate(names)}
    files: dict[str, dict[str, bytes]] = {name: {} for name in names}
    planted: dict[str, list] = {key: [] for key in ("ordinary", "private", "opted_out", "slow", "busy", "broken",
                                                    "mirrored", "missing_alt", "icons", "banners", "boilerplate")}

    def url(host: str, path: str) -> str:
        return f"http://127.0.0.1:{ports[host]}{path}"

    tags_by_host: dict[str, list[Image]] = {f"h{k}": [] for k in range(options.hosts)}
    for i, (data, caption, suffix) in enumerate(samples):
        page_host = f"h{i % options.hosts}"
        kind, host, path = "ordinary", page_host, f"/img/{i}.{suffix}"
        slot = i % 20  # one image in 20 of each kind, the rest ordinary
        if slot == 11:
            kind, host, path = "private", "h0", f"/private/{i}.{suffix}"
        elif slot == 1:
            kind, host = "opted_out", "optout"
        elif slot == 3:
            kind, host = "slow", "slow"
        elif slot == 5:
            kind, host = "busy", "busy"
        elif slot == 7:
            kind = "broken"
        elif slot == 9:
            kind = "missing_alt"
        if kind != "broken":
            files[host][path] = data
        if kind == "ordinary" and slot == 13:  # the same bytes under a mirror's URL, on another page
            mirror_path = f"/m/{i}.{suffix}"
            files["mirror"][mirror_path] = data
            planted["mirrored"].append([url(host, path), url("mirror", mirror_path)])
            tags_by_host[f"h{(i + 1) % options.hosts}"].append(Image(url("mirror", mirror_path), caption))
        planted[kind].append({"url": url(host, path), "text": caption} if kind != "missing_alt" else url(host, path))
        tags_by_host[page_host].append(Image(url(host, path), None if kind == "missing_alt" else caption))
    for n, alt in enumerate(BOILERPLATE):  # each on 12 icons: > 10 images, text_shared removes them
        for j in range(12):
            host, path = f"h{(n + j) % options.hosts}", f"/icons/{alt.replace(' ', '-')}-{j}.png"
            files[host][path] = _png((24, 24), (40 * n % 256, 20 * j % 256, 200))
            planted["boilerplate"].append({"url": url(host, path), "text": alt})
            tags_by_host[host].append(Image(url(host, path), alt))
    for j in range(max(2, len(samples) // 50)):  # icons and banners with texts of their own
        host = f"h{j % options.hosts}"
        for kind, size, text in (("icons", (24, 24), f"small icon of item number {j} in the shop"),
                                 ("banners", (728, 90), f"banner announcing the summer sale number {j}")):
            path = f"/{kind}/{j}.png"
            files[host][path] = _png(size, (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
            planted[kind].append({"url": url(host, path), "text": text})
            tags_by_host[host].append(Image(url(host, path), text))
    pages = []
    for host, tags in tags_by_host.items():
        rng.shuffle(tags)
        for p in range(0, len(tags), options.per_page):
            pages.append(Page(url(host, f"/pages/{p // options.per_page}.html"), f"{host} page {p // options.per_page}",
                              tags=tags[p:p + options.per_page]))
    out = Path(out)
    for host, served in files.items():
        for path, data in served.items():
            target = out / "sites" / host / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    write_crawl(pages, out / "crawl", name="web-00000", damaged=False)
    spec = {"ports": ports, "robots": {"h0": "User-agent: *\nDisallow: /private/\n"},
            "opt_out": {"optout": "noai"}, "latency": {"slow": [0.2, 0.4]}, "throttle": {"busy": [5, 1]},
            "options": asdict(options)}
    write_json(out / "web.json", spec)
    summary = {"images": len(samples), "pages": len(pages), "hosts": len(names),
               "counts": {k: len(v) for k, v in planted.items()}} | planted
    write_json(out / "planted.json", summary)
    return summary


def sites(root: Path) -> tuple[dict[str, Site], dict[str, int]]:
    """The hosts of a built web, their files read from disk, and their ports."""
    try:
        spec = json.loads((Path(root) / "web.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ConfigError(f"{root} holds no web.json: build the web first (`openalign web build --out {root}`)") \
            from None
    made: dict[str, Site] = {}
    for name in spec["ports"]:
        base = Path(root) / "sites" / name
        served = {"/" + str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()} \
            if base.is_dir() else {}
        throttle = spec["throttle"].get(name, [0, 1])
        made[name] = Site(files=served, robots=spec["robots"].get(name), opt_out=spec["opt_out"].get(name, ""),
                          latency=tuple(spec["latency"].get(name, (0.0, 0.0))), throttle=throttle[0],
                          retry_after=throttle[1])
    return made, dict(spec["ports"])


@contextmanager
def serve(root: Path) -> Iterator[Hosts]:
    """Serves a built web on 127.0.0.1 at its ports until the block ends."""
    made, ports = sites(root)
    hosts = Hosts(made, ports=ports)
    try:
        hosts.start()
    except OSError as err:
        raise ConfigError(f"cannot serve the web at ports {min(ports.values())}-{max(ports.values())} of 127.0.0.1 "
                          f"({err.strerror}); stop what uses them, or build the web again with another --port") \
            from None
    try:
        yield hosts
    finally:
        hosts.stop()
