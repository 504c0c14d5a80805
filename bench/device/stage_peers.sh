#!/usr/bin/env bash
# Stage vLLM 0.26.0 as a benchmark peer for the GPU machine (no registry there), beside what
# ../shared/device/stage.sh (outside this repository) stages.  See bench/device/PEERS.md.
#
# Order matters: stage.sh does `rm -rf .carry`, so run it first, then this, from the project root:
#
#     bash ../shared/device/stage.sh && bash bench/device/stage_peers.sh
#
# This downloads once into ~/.cache/tandem-stage-peers (TANDEM_STAGE_PEERS_CACHE) the vllm
# 0.26.0 wheel and exactly the runtime packages it imports that the GPU image lacks (cp312,
# manylinux x86_64, pinned below), installs them into one directory, deletes what a dense
# Llama run on an H100 never loads (each removal says why), packs that directory as one
# tar.xz and cuts it into .carry/p1, .carry/p2, ... sized to fit beside the working tree.
# It leaves stage.sh's .carry/1..N and .carry/env/{put.sh,setup.sh} alone and adds
# .carry/env/put_peer.sh and .carry/env/peers.sh.  Then, on the device, back to back with
# stage.sh's chunks (the machine keeps its disk only while it stays warm):
#     carry [".carry/p1", ".carry/env"]   command: bash .carry/env/put_peer.sh 1
#     ...                                  (the script prints the exact list)
# and in every later call that runs the peer:
#     carry [".carry/env"]   command: source .carry/env/setup.sh && source .carry/env/peers.sh && ...
#         PYTHONPATH="$TANDEM_PEER_PYTHONPATH:$PYTHONPATH" python3 <vllm script>
# peers.sh reassembles, checks and unpacks into /tmp/peers once per machine and exports
# TANDEM_PEER_PYTHONPATH=/tmp/peers; it does not touch PYTHONPATH, so the project's own
# processes keep their packages.  Re-run this (after stage.sh) when the tree grows by megabytes.
set -euo pipefail
self="$(readlink -f "$0")"
root="$(git rev-parse --show-toplevel)"
cd "$root"
[ -s .carry/env/setup.sh ] || { echo "stage_peers.sh: no .carry/env/setup.sh: run ../shared/device/stage.sh first (it empties .carry)"; exit 1; }
cache="${TANDEM_STAGE_PEERS_CACHE:-$HOME/.cache/tandem-stage-peers}"
wheels="$cache/wheels"
mkdir -p "$wheels"

# The GPU image has (and vLLM must use) torch 2.11.0+cu130, torchvision 0.26.0, torchaudio 2.11.0,
# triton 3.6.0, transformers 5.17.0, tokenizers, safetensors, sentencepiece, tiktoken,
# huggingface_hub, numpy 2.5.2, protobuf, grpcio and their dependencies (regex, pyyaml, filelock,
# requests, tqdm, packaging, jinja2, httpx, h11, idna, click, psutil, ...): none of those are
# staged, except numpy, typing-extensions and anyio (below), for version floors.  What vLLM 0.26.0 imports on the paths the
# benchmark uses (offline LLM, ngram / ngram_gpu speculation, dummy weights, the OpenAI server,
# LLMEngine.step), found by importing them (bench/device/peer_import_check.py):
PKGS=(
  vllm==0.26.0
  # engine, scheduler, IPC between the front end and the engine core
  msgspec==0.22.0 cbor2==6.3.0 pyzmq==27.3.0 cloudpickle==3.1.3 cachetools==8.0.2
  py-cpuinfo==9.0.0 einops==0.8.2 pillow==13.0.0 prometheus-client==0.26.0
  setproctitle==1.3.8 depyf==0.20.0 astor==0.8.1 dill==0.4.1
  # structured-output backends: their modules annotate classes with llguidance / xgrammar
  # types, so both are imported whenever vllm.v1.request is.  vLLM asks for llguidance
  # >=1.7,<1.8, which PyPI does not have (1.6.1 is the newest); only guided decoding with the
  # guidance backend would notice.  xgrammar 0.2.7 is the newest that accepts apache-tvm-ffi 0.1.10.
  llguidance==1.6.1 xgrammar==0.2.7
  # FlashInfer at vLLM's pin: the CUDA sampler imports vLLM's FlashInfer attention backend (and
  # with it flashinfer) and uses its top-k/top-p kernels; it shadows the 0.7.2.post1 that
  # stage.sh puts in /tmp/site.  ninja for its JIT (bin/ninja, put on PATH only if none is there).
  flashinfer-python==0.6.14 apache-tvm-ffi==0.1.10 nvidia-ml-py==13.615.71 ninja==1.13.2
  # method="ngram" (NgramProposer) runs numba; numba 0.65.0 refuses numpy > 2.4 at import
  # ("Numba needs NumPy 2.4 or less"), and the GPU has 2.5.2, so numpy 2.4.6 comes along and
  # is what the peer process sees (torch 2.11 and transformers are fine with it).
  numba==0.65.0 llvmlite==0.47.0 numpy==2.4.6
  # OpenAI-compatible server (vllm serve / python -m vllm.entrypoints.openai.api_server)
  fastapi==0.136.3 starlette==1.10.0 uvicorn==0.54.0 uvloop==0.23.0 httptools==0.9.0
  watchfiles==1.3.0 prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1
  partial-json-parser==0.2.1.1.post7 openai-harmony==0.0.8 model-hosting-container-standards==0.1.16
  jmespath==1.1.0 supervisor==4.3.0 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0
  attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1
  # openai: vLLM wants >=2.0; every 3.x needs httpx2, the newest 2.x uses the image's httpx
  openai==2.54.0 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1
  # pydantic as stage.sh pins it (the image may lack it; vLLM's configs are pydantic dataclasses).
  # pydantic 2.14 needs typing-extensions >= 4.16 and starlette anyio >= 4; torch and httpx
  # promise neither, so both come along (the same typing-extensions as stage.sh).
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 annotated-doc==0.0.7
  typing-extensions==4.16.0 anyio==4.16.0
)
# Left out on purpose (in vLLM's Requires-Dist, but imported only inside functions that these
# paths do not reach): anthropic, mcp, opentelemetry-*, lm-format-enforcer, outlines_core,
# compressed-tensors, mistral_common, blake3, ijson, python-json-logger, tilelang, quack-kernels,
# nvidia-cutlass-dsl, nvidia-cudnn-frontend, cuda-tile, tokenspeed-mla, humming-kernels,
# fastsafetensors, nvtx, torchcodec, PyNvVideoCodec, opencv-python-headless, six, setuptools.
# PEERS.md says where each one would be needed.

plats=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
py312=(--only-binary=:all: --python-version 3.12 --implementation cp "${plats[@]}")

# 1. wheels, once (the 290 MiB vllm wheel is taken from /tmp/vl when an earlier download left it there)
if ! ls "$wheels"/vllm-0.26.0-*.whl >/dev/null 2>&1 && ls /tmp/vl/vllm-0.26.0-*.whl >/dev/null 2>&1; then
  ln /tmp/vl/vllm-0.26.0-*.whl "$wheels"/ 2>/dev/null || cp /tmp/vl/vllm-0.26.0-*.whl "$wheels"/
fi
missing=()
for spec in "${PKGS[@]}"; do
  n="${spec%%==*}"; v="${spec##*==}"; n="${n//-/_}"
  ls "$wheels" | grep -qi "^${n}-${v}-" || missing+=("$spec")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "stage_peers.sh: downloading ${#missing[@]} wheel(s)"
  python3 -m pip download -q --no-deps --disable-pip-version-check "${py312[@]}" -d "$wheels" "${missing[@]}" 2>&1 |
    { grep -v -e "ignored: it is neither" || true; }
fi

# 2. one directory, trimmed, packed; cached per version of this script
key=$(sed -n '/^PKGS=(/,/^sha=/p' "$self" | sha256sum | cut -c1-12)  # the package list and the trimming
tarball="$cache/peers-$key.tar.xz"
if [ ! -s "$tarball" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  site="$tmp/peers"
  whls=()
  for spec in "${PKGS[@]}"; do
    n="${spec%%==*}"; v="${spec##*==}"; n="${n//-/_}"
    whls+=("$(ls "$wheels"/* | grep -i "/${n}-${v}-" | head -1)")
  done
  python3 -m pip install -q --no-deps --no-index --no-compile --disable-pip-version-check "${py312[@]}" \
    --target "$site" "${whls[@]}" 2>&1 | { grep -v -e "Running pip as the 'root' user" -e "ignored: it is neither" || true; }
  got=$(ls -d "$site"/*.dist-info | wc -l)
  [ "$got" -eq "${#PKGS[@]}" ] || { echo "stage_peers.sh: installed $got of ${#PKGS[@]} packages into $site"; exit 1; }
  before=$(du -sm "$site" | cut -f1)

  v="$site/vllm"
  # FlashAttention 2 kernels (305 MB): on sm90 vLLM picks FA3 (fa_utils.get_flash_attn_version);
  # FA2 is only for pre-Hopper GPUs, ALiBi models and batch-invariant mode.
  rm -f "$v/vllm_flash_attn/_vllm_fa2_C.abi3.so"
  # The Rust front end (43 MB): only with VLLM_USE_RUST_FRONTEND=1 (envs.py); default is Python.
  rm -f "$v/vllm-rs"
  # MoE kernels (48 MB): imported under contextlib.suppress(ImportError) in
  # CudaPlatform.import_kernels; used by fused_moe layers only, which a dense Llama has none of.
  rm -f "$v/_moe_C_stable_libtorch.abi3.so"
  # Vendored DeepGEMM (35 MB: FP8 GEMM JIT with CUTLASS headers and a _C per Python version):
  # without it has_deep_gemm() is False and the FP8 paths are off; bf16 Llama never uses it.
  rm -rf "$v/third_party/deep_gemm"
  # fmha_sm100 (30 MB of CUTLASS headers): MiniMax-M3 sparse attention on SM100, lazily imported.
  rm -rf "$v/third_party/fmha_sm100"
  # FlashInfer's JIT needs data/{csrc,include,spdlog}, data/cutlass/{include,tools/util/include}
  # and data/cccl/{cub,thrust,libcudacxx} (flashinfer/jit/env.py); the rest is examples, tests,
  # docs and Python sources of CUTLASS/CCCL that nothing imports.
  fd="$site/flashinfer/data"
  rm -rf "$fd"/cutlass/{examples,test,python,docs,media} "$fd"/cccl/{python,benchmarks,ci,docs,examples,test,c2h}
  # Test suites of numba, llvmlite and numpy (never imported at run time).
  rm -rf "$site"/numba/tests "$site"/llvmlite/tests "$site"/numpy/*/tests "$site"/numpy/tests
  # Console scripts carry this machine's interpreter in their shebang: useless there.  Keep
  # bin/ninja, which is a real binary.
  [ -d "$site/bin" ] && find "$site/bin" -type f ! -name ninja -delete
  # Symbol tables of the big shared objects (not their dynamic symbols, which loading uses):
  # about 30 MB of the FA3, vLLM custom-op and LLVM libraries.
  if command -v strip >/dev/null; then
    strip --strip-unneeded "$v/_C_stable_libtorch.abi3.so" "$v/vllm_flash_attn/_vllm_fa3_C.abi3.so" \
      "$site/llvmlite/binding/libllvmlite.so"
  fi
  after=$(du -sm "$site" | cut -f1)
  echo "stage_peers.sh: installed $before MB, trimmed to $after MB; packing (xz -9e, a few minutes)"
  tar cf - -C "$site" --owner=0 --group=0 --sort=name . | xz -9e -T0 > "$tarball.tmp"
  mv "$tarball.tmp" "$tarball"
  rm -rf "$tmp"; trap - EXIT
  # keep only the current tarball
  find "$cache" -maxdepth 1 -name 'peers-*.tar.xz' ! -name "peers-$key.tar.xz" -delete
fi
sha=$(sha256sum "$tarball" | cut -d' ' -f1)
size=$(stat -c %s "$tarball")

# 3. chunks sized like stage.sh's (62 MiB minus the working tree), less a margin for .carry/env
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
mib=$((1024 * 1024))
chunk=$(( 62 * mib - tree - mib / 2 ))
[ "$chunk" -gt $((8 * mib)) ] || { echo "stage_peers.sh: the working tree ($((tree / mib)) MiB) leaves no room; slim it"; exit 1; }
rm -rf .carry/p[0-9]* .carry/peer.*
split -b "$chunk" -d -a 2 "$tarball" .carry/peer.
n=0
for f in .carry/peer.*; do n=$((n + 1)); mkdir -p ".carry/p$n"; mv "$f" ".carry/p$n/part"; done

cat > .carry/env/put_peer.sh <<'EOF'
set -e; mkdir -p /root/stage; cp ".carry/p$1/part" "/root/stage/peer.$1"; echo "put peer chunk $1"; ls /root/stage
EOF
cat > .carry/env/peers.sh <<EOF
# sourced on the GPU machine after .carry/env/setup.sh (bench/device/stage_peers.sh wrote it)
if [ ! -e /tmp/peers/.ready-$sha ]; then
  for i in \$(seq 1 $n); do
    [ -s /root/stage/peer.\$i ] || { echo "peers.sh: peer chunk \$i missing (fresh machine?); put peer chunks 1..$n first"; return 1; }
  done
  cat \$(for i in \$(seq 1 $n); do echo /root/stage/peer.\$i; done) > /root/stage/peers.tar.xz
  echo "$sha  /root/stage/peers.tar.xz" | sha256sum -c --quiet || { echo "peers.sh: checksum mismatch: stage again"; return 1; }
  rm -rf /tmp/peers && mkdir -p /tmp/peers
  xz -dc /root/stage/peers.tar.xz | tar xf - -C /tmp/peers || { echo "peers.sh: unpacking failed"; return 1; }
  rm -f /root/stage/peers.tar.xz /root/stage/peer.*
  touch /tmp/peers/.ready-$sha
fi
export TANDEM_PEER_PYTHONPATH=/tmp/peers
command -v ninja >/dev/null 2>&1 || export PATH="\$PATH:/tmp/peers/bin"
echo "peers.sh: vllm 0.26.0 in \$TANDEM_PEER_PYTHONPATH; run it with PYTHONPATH=\"\\\$TANDEM_PEER_PYTHONPATH:\\\$PYTHONPATH\""
EOF
echo "peer payload $((size / mib)) MiB ($size bytes, sha256 ${sha:0:16}...); tree $((tree / mib)) MiB; cut into $n chunks of at most $((chunk / mib)) MiB."
echo "device calls, back to back with stage.sh's (after its chunks, or before them):"
for i in $(seq 1 $n); do echo "  carry [\".carry/p$i\", \".carry/env\"]  command: bash .carry/env/put_peer.sh $i"; done
echo "then, on the same machine (first the import check; peers.sh unpacks once, ~10-30 s):"
echo "  carry [\".carry/env\"]  command: source .carry/env/setup.sh && source .carry/env/peers.sh && PYTHONPATH=\"\$TANDEM_PEER_PYTHONPATH:\$PYTHONPATH\" python3 bench/device/peer_import_check.py --smoke"
echo "  (--smoke also starts an engine per method: a few minutes; without it the check takes under a minute)"
