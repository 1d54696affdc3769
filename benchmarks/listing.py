"""Listing benchmark: our candidate listing against a naive reader, on a realistic bundle.

Builds in a temporary folder (removed at the end unless ``--keep``):

* ``java/``: a bundle shaped like the Scala Spark example of seed 000: 167 JARs, one
  handler JAR (Main-Class + Airflow-Cache-Digest) and 166 dependency JARs of
  realistic sizes, 5 of them with a Main-Class and several with more than 10,000
  entries;
* ``go/``: 200 AFBNDL01 bundles of 20-50 MB each (sparse: a real head and tail around
  a hole, so 7 GB of bundles take little disk; the binary SHA-256 is still real);
* ``typescript/``: 200 ``.min.mjs`` bundles.

Then measures, in one run and on a warm page cache:

* our listing (``list_candidates`` with a fresh cache) per language;
* the naive baseline: open every JAR with ``zipfile`` and read its manifest; SHA-256
  every Go and TypeScript file;
* bytes read per opened file and per candidate (counted by the readers' file layer);
* relisting the unchanged tree with the cache from the first listing.

Sparse Go files make the naive baseline faster than on real disks (holes read as
zeros without I/O), so the reported ratio understates the gap. Run:
``python -m benchmarks.listing [--scale 0.1] [--repeat 3] [--keep]``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._report import print_table, ratio, timed, write_json
from taskhandler_devenv.packers import (
    go_bundle_tail,
    pack_typescript_bundle,
    render_manifest,
)
from taskhandler_operator.artifacts.listing import ListingCache, ListingResult, list_candidates
from taskhandler_operator.artifacts.models import Language

MiB = 1 << 20
JAR_COUNT = 167
DEPENDENCY_MAIN_CLASSES = 5
# (entries, size in MiB) of the largest dependency JARs, after spark-core, spark-sql,
# spark-catalyst, scala-compiler, scala-library and hadoop-client-api.
BIG_JARS = [
    (10_400, 14.0),
    (12_800, 10.5),
    (11_300, 13.0),
    (14_500, 11.0),
    (10_100, 5.7),
    (21_000, 19.5),
]
GO_COUNT = 200
GO_SIZE_RANGE = (20 * MiB, 50 * MiB)
TS_COUNT = 200
TS_SIZE_RANGE = (20 << 10, 1 * MiB)
TARGET_SPEEDUP = 10.0
TARGET_MEDIAN_BYTES = 64 << 10
TARGET_RELIST_SPEEDUP = 5.0
# Real data around sparse holes: enough for a believable ELF head and symbol tail.
GO_REAL_EDGE = 64 << 10


class _Pool:
    """Pseudo-random bytes to slice entry contents from (fast to build).

    Mostly noise, so a JAR's size on disk stays close to the size asked for, as with
    real dependency JARs whose classes are already dense.
    """

    def __init__(self, rng: random.Random, size: int = 4 * MiB) -> None:
        noise = rng.randbytes(size - size // 8)
        text = (b"public final class Example { int value; String name; }\n" * (size // 400))[
            : size // 8
        ]
        self.data = noise + text

    def take(self, rng: random.Random, length: int) -> bytes:
        if length <= 0:
            return b""
        if length >= len(self.data):
            return (self.data * (length // len(self.data) + 1))[:length]
        start = rng.randrange(0, len(self.data) - length)
        return self.data[start : start + length]


@dataclass(frozen=True)
class Built:
    files: int
    bytes_on_disk_apparent: int


def _write_jar(
    path: Path,
    manifest: dict[str, str],
    entries: int,
    payload: int,
    pool: _Pool,
    rng: random.Random,
) -> None:
    per_entry = max(1, payload // max(entries, 1))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as jar:
        jar.writestr(zipfile.ZipInfo("META-INF/"), b"")
        jar.writestr("META-INF/MANIFEST.MF", render_manifest(manifest))
        for i in range(entries):
            package = f"org/example/p{i % 97}/q{i % 13}"
            jar.writestr(f"{package}/Class{i}.class", pool.take(rng, per_entry))


def build_java(root: Path, rng: random.Random, pool: _Pool, scale: float) -> Built:
    lib = root / "lib"
    lib.mkdir(parents=True)
    handler = {
        "Main-Class": "org.apache.airflow.example.spark.Handlers",
        "Airflow-Cache-Digest": hashlib.sha256(b"handler").hexdigest(),
        "Airflow-Supervisor-Schema-Version": "2026-10-30",
        "Created-By": "Gradle 9.1",
    }
    _write_jar(
        root / "airflow-java-sdk-scala-spark-example.jar",
        handler,
        40,
        int(21_000 * scale),
        pool,
        rng,
    )
    total = (root / "airflow-java-sdk-scala-spark-example.jar").stat().st_size
    dependencies = JAR_COUNT - 1
    for index in range(dependencies):
        manifest = {"Created-By": "Apache Maven 3.9", "Implementation-Title": f"dependency-{index}"}
        if index < DEPENDENCY_MAIN_CLASSES:
            manifest["Main-Class"] = f"org.example.dep{index}.Main"
        if index < len(BIG_JARS):
            entries, size_mib = BIG_JARS[index]
            payload = int(size_mib * MiB * scale)
        else:
            # Log-normal around 150 KB, as dependency sets are: many small, a few large.
            payload = int(min(max(rng.lognormvariate(11.9, 1.3), 3_000), 30 * MiB) * scale)
            entries = max(3, min(4_000, payload // 2_500))
        path = lib / f"dependency-{index:03d}-1.0.{index % 7}.jar"
        _write_jar(path, manifest, entries, payload, pool, rng)
        total += path.stat().st_size
    return Built(JAR_COUNT, total)


_ZERO_MIB = bytes(MiB)


def _sha256_with_hole(head: bytes, hole: int, tail: bytes) -> bytes:
    h = hashlib.sha256(head)
    remaining = hole
    while remaining:
        step = min(remaining, MiB)
        h.update(_ZERO_MIB[:step])
        remaining -= step
    h.update(tail)
    return h.digest()


def build_go(root: Path, rng: random.Random, scale: float) -> Built:
    root.mkdir(parents=True)
    total = 0
    low, high = (int(v * scale) for v in GO_SIZE_RANGE)
    for index in range(GO_COUNT):
        size = max(rng.randint(low, high), 2 * GO_REAL_EDGE + 1)
        edge = min(GO_REAL_EDGE, size // 2)
        head = b"\x7fELF\x02\x01\x01" + rng.randbytes(edge - 7)
        tail = rng.randbytes(edge)
        hole = size - 2 * edge
        digest = _sha256_with_hole(head, hole, tail)
        source = b"package main\n\nfunc main() { airflow.Serve() }\n" * 20
        appended = go_bundle_tail(digest, sources={"main.go": source})
        path = root / f"handler-{index:03d}"
        with path.open("wb") as out:
            out.write(head)
            out.seek(hole, os.SEEK_CUR)  # leave a hole: the file stays sparse
            out.write(tail)
            out.write(appended)
        path.chmod(0o755)
        total += path.stat().st_size
    return Built(GO_COUNT, total)


def build_typescript(root: Path, rng: random.Random, pool: _Pool, scale: float) -> Built:
    root.mkdir(parents=True)
    total = 0
    low, high = (max(16, int(v * scale)) for v in TS_SIZE_RANGE)
    for index in range(TS_COUNT):
        code = pool.take(rng, rng.randint(low, high)).replace(b"*/", b"*_")
        sources = {
            f"src/handler{index}.ts": pool.take(rng, rng.randint(1_000, 20_000)),
            "src/util.ts": pool.take(rng, rng.randint(1_000, 5_000)),
        }
        data = pack_typescript_bundle(code, sources=sources)
        path = root / f"handler-{index:03d}.min.mjs"
        path.write_bytes(data)
        total += len(data)
    return Built(TS_COUNT, total)


# -- the naive baseline ----------------------------------------------------------------------


class _CountingFile(io.RawIOBase):
    """A read-only file that counts the bytes handed to zipfile."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("rb", buffering=0)
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._f.readinto(buffer) or 0
        self.bytes_read += n
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def close(self) -> None:
        self._f.close()
        super().close()


def _walk_sorted(root: Path) -> list[Path]:
    found: list[Path] = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        found.extend(Path(directory) / name for name in sorted(files))
    return found


def naive_java(root: Path) -> tuple[int, int]:
    """(manifests found, bytes read): zipfile parses the whole central directory."""
    found = read = 0
    for path in _walk_sorted(root):
        if not path.name.endswith(".jar"):
            continue
        counting = _CountingFile(path)
        try:
            with zipfile.ZipFile(counting) as jar:
                jar.read("META-INF/MANIFEST.MF")
                found += 1
        except (KeyError, zipfile.BadZipFile):
            pass
        finally:
            read += counting.bytes_read
            counting.close()
    return found, read


def naive_hash(root: Path, suffix: str = "") -> tuple[int, int]:
    """(files hashed, bytes read): SHA-256 of every (matching) file."""
    files = read = 0
    for path in _walk_sorted(root):
        if not path.name.endswith(suffix):
            continue
        h = hashlib.sha256()
        with path.open("rb", buffering=0) as f:
            while chunk := f.read(MiB):
                h.update(chunk)
                read += len(chunk)
        files += 1
    return files, read


# -- run ---------------------------------------------------------------------------------------


def _median(values: list[int]) -> float:
    return float(statistics.median(values)) if values else 0.0


def measure(
    name: str, root: Path, language: Language, naive: Callable[[], tuple[int, int]], repeat: int
) -> dict[str, Any]:
    naive_s, (_naive_files, naive_bytes) = timed(naive, repeat)
    caches: list[ListingCache] = []

    def first() -> ListingResult:
        cache = ListingCache()
        caches.append(cache)
        return list_candidates(root, language, cache)

    ours_s, result = timed(first, repeat)
    cache = caches[-1]
    relist_s, relisted = timed(lambda: list_candidates(root, language, cache), repeat)
    assert relisted.candidates == result.candidates
    per_file = list(result.stats.bytes_by_file.values())
    per_candidate = [result.stats.bytes_by_file[c.rel_path] for c in result.candidates]
    return {
        "set": name,
        "files": result.stats.files_walked,
        "candidates": len(result.candidates),
        "ours_s": ours_s,
        "naive_s": naive_s,
        "speedup": ratio(naive_s, ours_s),
        "ours_bytes": result.stats.bytes_read,
        "naive_bytes": naive_bytes,
        "median_B_per_file": _median(per_file),
        "median_B_per_candidate": _median(per_candidate),
        "relist_s": relist_s,
        "relist_speedup": ratio(ours_s, relist_s),
        "relist_opened": relisted.stats.files_opened,
        "_per_file": per_file,
        "_per_candidate": per_candidate,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every byte size (default 1.0)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per measurement; the median is kept"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where to build (default: system temp)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the built tree")
    parser.add_argument(
        "--check-targets", action="store_true", help="exit 1 when a target is missed"
    )
    args = parser.parse_args(argv)

    base = Path(tempfile.mkdtemp(prefix="thop-listing-bench-", dir=args.workdir))
    try:
        rng = random.Random(args.seed)
        pool = _Pool(rng)
        started = time.perf_counter()
        built = {
            "java": build_java(base / "java", rng, pool, args.scale),
            "go": build_go(base / "go", rng, args.scale),
            "typescript": build_typescript(base / "typescript", rng, pool, args.scale),
        }
        build_s = time.perf_counter() - started
        print(
            f"built in {build_s:.1f}s under {base}: "
            + ", ".join(
                f"{k} {v.files} files / {v.bytes_on_disk_apparent / MiB:,.0f} MiB"
                for k, v in built.items()
            ),
            file=sys.stderr,
        )
        # Files younger than the cache's racy window are not cached; let them age.
        time.sleep(ListingCache().racy_window_ns / 1e9 + 0.1)

        rows = [
            measure(
                "java (Spark-shaped)",
                base / "java",
                Language.JAVA,
                lambda: naive_java(base / "java"),
                args.repeat,
            ),
            measure("go", base / "go", Language.GO, lambda: naive_hash(base / "go"), args.repeat),
            measure(
                "typescript",
                base / "typescript",
                Language.TYPESCRIPT,
                lambda: naive_hash(base / "typescript", ".min.mjs"),
                args.repeat,
            ),
        ]
        all_files = [b for row in rows for b in row["_per_file"]]
        all_candidates = [b for row in rows for b in row["_per_candidate"]]
        total = {
            "set": "total",
            "files": sum(r["files"] for r in rows),
            "candidates": sum(r["candidates"] for r in rows),
            "ours_s": sum(r["ours_s"] for r in rows),
            "naive_s": sum(r["naive_s"] for r in rows),
            "ours_bytes": sum(r["ours_bytes"] for r in rows),
            "naive_bytes": sum(r["naive_bytes"] for r in rows),
            "median_B_per_file": _median(all_files),
            "median_B_per_candidate": _median(all_candidates),
            "relist_s": sum(r["relist_s"] for r in rows),
            "relist_opened": sum(r["relist_opened"] for r in rows),
        }
        total["speedup"] = ratio(total["naive_s"], total["ours_s"])
        total["relist_speedup"] = ratio(total["ours_s"], total["relist_s"])
        rows.append(total)
        for row in rows:
            row.pop("_per_file", None)
            row.pop("_per_candidate", None)

        columns = [
            "set",
            "files",
            "candidates",
            "ours_s",
            "naive_s",
            "speedup",
            "median_B_per_file",
            "median_B_per_candidate",
            "relist_s",
            "relist_speedup",
        ]
        print_table(
            rows, columns, title=f"listing benchmark (scale {args.scale}, median of {args.repeat})"
        )
        targets = {
            "listing_speedup_at_least_10x": total["speedup"] >= TARGET_SPEEDUP,
            "median_bytes_per_candidate_under_64KiB": total["median_B_per_candidate"]
            < TARGET_MEDIAN_BYTES,
            "median_bytes_per_opened_file_under_64KiB": total["median_B_per_file"]
            < TARGET_MEDIAN_BYTES,
            "relisting_at_least_5x_faster": total["relist_speedup"] >= TARGET_RELIST_SPEEDUP,
        }
        print()
        for name, ok in targets.items():
            print(f"{'PASS' if ok else 'FAIL'}  {name}")
        path = write_json(
            "listing",
            {
                "scale": args.scale,
                "repeat": args.repeat,
                "seed": args.seed,
                "build_s": build_s,
                "built": {k: vars(v) for k, v in built.items()},
                "rows": rows,
                "targets": targets,
            },
        )
        print(f"\nwrote {path}")
        # Targets are reported, not enforced: these are noisy shared machines. --check-targets
        # turns a miss into exit 1 for someone who wants a gate.
        return 1 if args.check_targets and not all(targets.values()) else 0
    finally:
        if args.keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
