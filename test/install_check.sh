#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds a consumer of the
# runtime twice: through pkg-config and through find_package(gpulaunch).
set -euo pipefail
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cat >"$tmp/consumer.c" <<'C'
#include <gpulaunch/gpulaunch.h>
#include <stdio.h>
int main(void) {
    gpl_comm_t c = NULL;
    gpl_result_t r = gpl_init(NULL, &c);
    float x = 2;
    if (r == GPL_OK)
        r = gpl_allreduce(c, &x, &x, 1, GPL_FLOAT32, GPL_SUM, NULL);
    int world = gpl_world_size(c);
    printf("%s world=%d x=%g\n", gpl_result_name(r), world, x);
    gpl_finalize(c);
    return r == GPL_OK && x == 2.0f * (float)world ? 0 : 1;
}
C
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc "$tmp/consumer.c" -o "$tmp/by-pkgconfig" $(pkg-config --cflags --libs gpulaunch) \
  -Wl,-rpath,"$tmp/prefix/lib"
env -u WORLD_SIZE -u RANK "$tmp/by-pkgconfig"
mkdir -p "$tmp/cm"
cat >"$tmp/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(gpulaunch REQUIRED)
add_executable(consumer ../consumer.c)
target_link_libraries(consumer PRIVATE gpulaunch::gpulaunch)
CM
cmake -S "$tmp/cm" -B "$tmp/cm/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm/b" >/dev/null
env -u WORLD_SIZE -u RANK "$tmp/cm/b/consumer"
"$tmp/prefix/bin/gpulaunch" --standalone --nproc-per-node 2 "$tmp/cm/b/consumer" | grep -c 'GPL_OK world=2 x=4' | grep -q 2
echo "install check: pkg-config, find_package and the installed launcher work"
