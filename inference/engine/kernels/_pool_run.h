/* The elastic pool's entry point as the C kernels share it (_elastic_pool.h): the `_matmul` extension owns the pool
 * and exports `pool_run` as a capsule of this type, which other extensions import, so that every kernel's threads
 * are the same few (two pools would spin against each other for the same cores). */
#pragma once
#include <stdint.h>

typedef void (*ChunkFn)(void *ctx, int64_t chunk);
/* runs fn(ctx, c) for every c in [0, total) on the pool's threads; `parallel` 0 keeps it on the calling thread */
typedef void (*PoolRun)(ChunkFn fn, void *ctx, int64_t total, int parallel);

#define POOL_RUN_CAPSULE "inference.engine.kernels._matmul.pool_run"
