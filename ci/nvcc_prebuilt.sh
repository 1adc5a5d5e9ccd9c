#!/usr/bin/env bash
# An nvcc stand-in that builds the package from fatbins compiled elsewhere (e.g. the wheel's
# pinned toolkit off the device), so the device times exactly the code a wheel ships.
#   setup on the device:  mkdir -p /tmp/nv/bin && cp ci/nvcc_prebuilt.sh /tmp/nv/bin/nvcc &&
#                         ln -sfn DIR_WITH_cuda.h /tmp/nv/include
#   build:                CUDACXX=/tmp/nv/bin/nvcc PREBUILT=DIR REAL_NVCC=$(command -v nvcc) pip install ...
# A `-fatbin` compile of FORM.cu for sm_ARCH copies $PREBUILT/FORM.sm_ARCH.fatbin when it exists
# (and logs it to /tmp/nvcc_prebuilt.log); every other call goes to $REAL_NVCC. The fatbins must
# come from the same sources: the stand-in cannot tell.
set -u
out="" src="" arch="" prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  case $a in
    *.cu) src=$a ;;
    arch=compute_*) arch=${a#*code=} ;;
  esac
  prev=$a
done
if [ -n "$out" ] && [ -n "$src" ] && [ -n "$arch" ]; then
  f="$PREBUILT/$(basename "$src" .cu).$arch.fatbin"
  if [ -f "$f" ]; then
    cp "$f" "$out" && echo "prebuilt $f" >>/tmp/nvcc_prebuilt.log && exit 0
  fi
fi
exec "$REAL_NVCC" "$@"
