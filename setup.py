"""Builds peloton.collective._core, the C++17 collective runtime (metadata is in pyproject.toml).

The NCCL path is always compiled and loads libnccl.so.2 and the CUDA runtime with dlopen at run
time, so one build works with or without GPUs. Where the real headers exist (nccl.h from the
nvidia-nccl-cu12/cu13 wheel or NCCL_HOME, cuda_runtime_api.h from CUDA_HOME or /usr/local/cuda)
they are used (PELOTON_HAVE_NCCL_H / PELOTON_HAVE_CUDA_H) so the compiler checks our declarations
against them; otherwise csrc/nccl_api.h spells out the few ABI-stable declarations it needs.
OpenSSL's libcrypto (the gang handshake's HMAC-SHA256, csrc/auth.cc) is linked in statically
from libssl-dev, its symbols hidden (see libcrypto).

`python setup.py build_cpp_tests` builds the runtime's C++ unit tests (csrc/tests, doctest) with
the extension's compiler flags plus -Werror into build/cpp-tests/collective_tests;
tests/test_collective_cpp.py builds and runs them, so `make test` does.

`python setup.py build_bundle` builds the runtime bundle for task containers into
build/peloton-runtime (see BuildBundle): the runtime behind a C ABI, its self-check and the C
library they run on, for images that have no peloton, no Python and no C library of their own.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sysconfig
import tomllib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import Command, setup
from setuptools.errors import ExecError

# Compile the sources in parallel (PELOTON_BUILD_JOBS, default: every core).
ParallelCompile("PELOTON_BUILD_JOBS", default=0).install()

CSRC = Path("peloton/collective/csrc")
CAPI = CSRC / "capi"  # the C ABI and the self-check: the bundle's, not the extension's
INCLUDE = Path("peloton/collective/include")
CXX_FLAGS = ["-O3", "-Wall", "-Wextra", "-pthread"]
# Where task containers mount the bundle (an image volume): its programs name their loader and
# libraries there.
BUNDLE_PREFIX = "/opt/peloton"


def nccl_include() -> str | None:
    """The directory holding nccl.h: NCCL_HOME, the nvidia-nccl wheel, or the system."""
    candidates = []
    if os.environ.get("NCCL_HOME"):
        candidates.append(Path(os.environ["NCCL_HOME"]) / "include")
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations or [] if spec else []:
        candidates.append(Path(root) / "nccl" / "include")
    candidates.append(Path("/usr/include"))
    return next((str(c) for c in candidates if (c / "nccl.h").is_file()), None)


def cuda_include() -> str | None:
    """The directory holding cuda_runtime_api.h (CUDA_HOME, else /usr/local/cuda)."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    return str(home) if (home / "cuda_runtime_api.h").is_file() else None


def cxx() -> list[str]:
    """The C++ compiler command (CXX, else Python's)."""
    return shlex.split(os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++")


def libcrypto() -> str:
    """OpenSSL's libcrypto as a static archive (the gang handshake's HMAC-SHA256): linked into
    the extension and the bundle's library with its symbols hidden, so the runtime needs no
    OpenSSL in the task's image and clashes with none loaded beside it (Python's own)."""
    found = subprocess.run(
        [*cxx(), "-print-file-name=libcrypto.a"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not Path(found).is_absolute():
        raise ExecError("the collective runtime links OpenSSL's libcrypto.a: install libssl-dev")
    return found


include_dirs = [str(CSRC)]
macros: list[tuple[str, str | None]] = []
if (cuda := cuda_include()) is not None:
    include_dirs.append(cuda)
    macros.append(("PELOTON_HAVE_CUDA_H", "1"))
    if (nccl := nccl_include()) is not None:
        include_dirs.append(nccl)
        macros.append(("PELOTON_HAVE_NCCL_H", "1"))

core = Pybind11Extension(
    "peloton.collective._core",
    sorted(str(p) for p in CSRC.glob("*.cc")),
    # Headers: rebuild when they change, and ship them in the sdist.
    depends=sorted(str(p) for p in CSRC.glob("*.h")),
    include_dirs=include_dirs,
    define_macros=macros,
    cxx_std=17,
    extra_compile_args=CXX_FLAGS,
    extra_link_args=[libcrypto(), "-Wl,--exclude-libs,ALL", "-pthread", "-ldl"],
)


def compile_objects(
    command: Command,
    flags: list[str],
    objects: dict[Path, Path],
    newest_dependency: Callable[[Path], float],
) -> list[Path]:
    """Compiles each source to its object, in parallel (PELOTON_BUILD_JOBS, default: every core),
    unless the object is newer than the source and ``newest_dependency(source)`` (an mtime)."""

    def compile_one(src: Path) -> Path:
        obj = objects[src]
        newest = max(src.stat().st_mtime, newest_dependency(src))
        if not obj.exists() or obj.stat().st_mtime < newest:
            command.announce(f"compiling {src}", level=2)
            subprocess.run([*cxx(), *flags, "-c", str(src), "-o", str(obj)], check=True)
        return obj

    jobs = int(os.environ.get("PELOTON_BUILD_JOBS") or 0) or os.cpu_count() or 1
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(compile_one, objects))


def newest_mtime(paths: Iterable[Path]) -> float:
    return max((p.stat().st_mtime for p in paths), default=0.0)


class BuildCppTests(Command):
    """Builds the C++ unit tests: the runtime's sources but the binding (module.cc) and NCCL."""

    description = "build the collective runtime's C++ unit tests (build/cpp-tests/collective_tests)"
    user_options = [("build-dir=", None, "where objects and the test binary go")]

    def initialize_options(self) -> None:
        self.build_dir = "build/cpp-tests"

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        out = Path(self.build_dir)
        out.mkdir(parents=True, exist_ok=True)
        flags = [
            "-std=c++17",
            *CXX_FLAGS,
            "-Werror",
            f"-I{CSRC}",
            # doctest.h is someone else's code: its warnings are not ours to fail on.
            f"-isystem{CSRC / 'tests'}",
        ]
        binding = ("module.cc", "nccl_comm.cc")
        runtime = [p for p in sorted(CSRC.glob("*.cc")) if p.name not in binding]
        sources = runtime + sorted((CSRC / "tests").glob("*.cc"))
        newest_header = newest_mtime([*CSRC.glob("*.h"), *(CSRC / "tests").glob("*.h")])
        objects = compile_objects(
            self,
            flags,
            {
                s: out / (s.stem + (".test.o" if s.parent.name == "tests" else ".o"))
                for s in sources
            },
            # test_main.cc is only doctest's main: it depends on doctest.h alone.
            lambda src: newest_header if src.name != "test_main.cc" else 0.0,
        )
        binary = out / "collective_tests"
        link = [*cxx(), *CXX_FLAGS, *map(str, objects), "-o", str(binary), libcrypto(), "-ldl"]
        subprocess.run(link, check=True)
        self.announce(f"built {binary}", level=2)


class BuildBundle(Command):
    """Builds the runtime bundle that task containers mount read-only at BUNDLE_PREFIX:

    - ``lib/libpeloton_collective.so``: the runtime (csrc/*.cc but the Python binding) behind
      the C ABI of ``include/peloton_collective.h``;
    - ``bin/peloton-collective-check``: the self-check, a program over that C ABI;
    - ``lib/glibc/``: the C library the two run on (the loader, libc, libm and the libdl,
      libpthread and librt that loaded NCCL and CUDA libraries ask for), copied from this build
      machine as ldd resolves them;
    - ``include/``, ``share/examples/allreduce_worker.c`` and ``VERSION`` (the package's).

    Why a bundled C library rather than static programs: a static glibc program cannot dlopen
    NCCL, the CUDA runtime or the driver (they need the shared libc), and cannot serve a worker
    that links the runtime as a shared library. So the programs are dynamic, with the bundle's
    loader as ELF interpreter (BUNDLE_PREFIX/lib/glibc/ld-linux-*.so.*) and the bundle's
    directories as DT_RPATH (``$ORIGIN``-relative first, then BUNDLE_PREFIX for when /proc, which
    ``$ORIGIN`` needs, is not mounted). DT_RPATH, not RUNPATH: the executable's DT_RPATH also
    serves the dependencies of its libraries, libpeloton_collective.so's libm among them.

    The C library sits in its own directory, on no one's library path but the bundle programs':
    tasks get LD_LIBRARY_PATH=BUNDLE_PREFIX/lib (for libpeloton_collective.so), and a libc.so.6 of
    another version than an image's loader would crash every program of that image. For the same
    reason libstdc++ and libgcc are linked in statically and hidden, and the library names no
    RUNPATH: in an image with its own glibc (new enough), its programs load the runtime library
    against that glibc.

    The programs run as they are only where the bundle is at BUNDLE_PREFIX; from anywhere else
    (the build directory) through the bundled loader: ``lib/glibc/ld-linux-x86-64.so.2
    bin/peloton-collective-check`` (peloton.collective.bundle.host_command).
    """

    description = "build the collective runtime bundle for task containers (build/peloton-runtime)"
    user_options = [
        ("build-dir=", None, "the bundle directory"),
        ("build-temp=", None, "where the objects go"),
    ]

    def initialize_options(self) -> None:
        self.build_dir = "build/peloton-runtime"
        self.build_temp = "build/peloton-runtime-obj"

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        out, tmp = Path(self.build_dir), Path(self.build_temp)
        for d in (
            out / "bin",
            out / "lib" / "glibc",
            out / "include",
            out / "share" / "examples",
            tmp,
        ):
            d.mkdir(parents=True, exist_ok=True)
        version = tomllib.loads(Path("pyproject.toml").read_text())["project"]["version"]
        flags = [
            "-std=c++17",
            *CXX_FLAGS,
            "-fPIC",
            # The library exports the C ABI (PELOTON_API) and nothing else (capi/exports.map
            # holds std:: templates, which libstdc++ marks visible, to that too).
            "-fvisibility=hidden",
            *(f"-I{d}" for d in include_dirs),
            f"-I{INCLUDE}",
            *(f"-D{name}" if value is None else f"-D{name}={value}" for name, value in macros),
            f'-DPELOTON_VERSION="{version}"',
        ]
        runtime = [p for p in sorted(CSRC.glob("*.cc")) if p.name != "module.cc"]
        library_sources = [*runtime, CAPI / "capi.cc", CAPI / "gang_env.cc"]
        check_source = CAPI / "check_main.cc"
        headers = [*CSRC.glob("*.h"), *CAPI.glob("*.h"), *INCLUDE.glob("*.h")]
        # The flags are in setup.py; capi.cc compiles the version (pyproject.toml) in.
        newest_dependency = newest_mtime([*headers, Path("setup.py"), Path("pyproject.toml")])
        objects = compile_objects(
            self,
            flags,
            {s: tmp / f"{s.stem}.o" for s in [*library_sources, check_source]},
            lambda src: newest_dependency,
        )
        library_objects, check_object = objects[:-1], objects[-1]
        # Static libstdc++/libgcc and exported C only. The glibc libraries NCCL, the CUDA runtime
        # and the driver ask for are needed by name (by file: since glibc 2.34 -ldl and friends
        # are empty archives) though the runtime calls nothing in them: so the bundle carries
        # them, and a dlopen finds them loaded instead of searching an image that has none, or
        # those of another glibc version, which do not load against this libc.
        glibc_extras = [
            "-Wl,--push-state,--no-as-needed",
            "-l:libdl.so.2",
            "-l:libpthread.so.0",
            "-l:librt.so.1",
            "-l:libm.so.6",
            "-Wl,--pop-state",
        ]
        cxx_runtime = ["-static-libstdc++", "-static-libgcc", "-pthread"]
        library = out / "lib" / "libpeloton_collective.so"
        self.link(
            library,
            [*library_objects, CAPI / "exports.map"],
            [
                "-shared",
                "-Wl,-soname,libpeloton_collective.so",
                "-Wl,-z,defs",
                "-Wl,--exclude-libs,ALL",
                f"-Wl,--version-script={CAPI / 'exports.map'}",
                libcrypto(),
                *cxx_runtime,
                *glibc_extras,
            ],
        )
        loader = self.copy_glibc(library, out / "lib" / "glibc")
        search = [
            "$ORIGIN/../lib",
            "$ORIGIN/../lib/glibc",
            f"{BUNDLE_PREFIX}/lib",
            f"{BUNDLE_PREFIX}/lib/glibc",
        ]
        self.link(
            out / "bin" / "peloton-collective-check",
            [check_object, library],
            [
                f"-L{library.parent}",
                "-lpeloton_collective",
                f"-Wl,--dynamic-linker={BUNDLE_PREFIX}/lib/glibc/{loader}",
                "-Wl,--disable-new-dtags",
                f"-Wl,-rpath,{':'.join(search)}",
                *cxx_runtime,
            ],
        )
        for src, dst in [
            (INCLUDE / "peloton_collective.h", out / "include" / "peloton_collective.h"),
            (CAPI / "allreduce_worker.c", out / "share" / "examples" / "allreduce_worker.c"),
        ]:
            replace_if_changed(src, dst)
        if not (out / "VERSION").exists() or (out / "VERSION").read_text() != version + "\n":
            (out / "VERSION").write_text(version + "\n")
        self.announce(f"built the runtime bundle {version} in {out}", level=2)

    def link(self, output: Path, inputs: list[Path], args: list[str]) -> None:
        """Links ``output`` from object files and libraries ``inputs`` unless it is newer than
        them and setup.py (the linker writes a new file: programs running the old one keep it)."""
        if output.exists() and output.stat().st_mtime >= newest_mtime([*inputs, Path("setup.py")]):
            return
        objects = [str(p) for p in inputs if p.suffix == ".o"]
        self.announce(f"linking {output}", level=2)
        subprocess.run([*cxx(), *CXX_FLAGS, *objects, "-o", str(output), *args], check=True)

    def copy_glibc(self, library: Path, into: Path) -> str:
        """Copies the shared libraries ``library`` needs, as ldd resolves them here, into
        ``into``; returns the loader's file name."""
        try:
            listing = subprocess.run(
                ["ldd", str(library)], capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            raise ExecError(f"ldd {library} failed ({exc}): the bundle needs glibc's ldd") from None
        loader = ""
        for line in listing.splitlines():
            # "libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)", the loader as
            # "/lib64/ld-linux-x86-64.so.2 (0x...)", the kernel's vDSO as "linux-vdso.so.1 (0x...)"
            name, arrow, where = line.strip().partition(" => ")
            path = (where if arrow else name).rsplit(" (", 1)[0]
            if arrow and not path.startswith("/"):
                raise ExecError(f"ldd {library}: {name} {path}")
            if not arrow and not path.startswith("/"):
                continue  # the vDSO: no file
            if not arrow:
                loader = name = Path(path).name
            replace_if_changed(Path(path), into / name)
        if not loader:
            raise ExecError(f"ldd {library} named no loader:\n{listing}")
        return loader


def replace_if_changed(src: Path, dst: Path) -> None:
    """Copies ``src`` (a symlink's target) to ``dst`` unless dst has its size and mtime, through
    a new file: a program running the old one keeps it."""
    stat = src.stat()
    if dst.exists() and (dst.stat().st_size, dst.stat().st_mtime) == (stat.st_size, stat.st_mtime):
        return
    partial = dst.with_name(f".{dst.name}.partial")
    shutil.copy2(src, partial)
    partial.replace(dst)


setup(
    ext_modules=[core],
    cmdclass={"build_cpp_tests": BuildCppTests, "build_bundle": BuildBundle},
)
