// Gather and scatter of whole paged-KV blocks through one contiguous staging buffer, for
// checkpoints and swapping (runtime/src/backend/cuda/staging.rs compiles it with NVRTC).
//
// table: [2 * n_layers] cache base addresses (layer 0 K, layer 0 V, layer 1 K, ...), then
// [n_blocks] physical block ids. One CTA per part (block b, layer l, K or V): part p = b * 2L + 2l
// + kv holds part_bytes bytes at cache + id * part_bytes, and sits at stage + p * part_bytes, so a
// block's bytes in the staging buffer are [layers, 2, block_size, KVH, D] as the checkpoint format
// stores them. scatter = 0 copies cache -> stage, 1 stage -> cache.
extern "C" __global__ void kv_stage_copy(const unsigned long long* __restrict__ table,
                                         unsigned int n_layers, unsigned long long part_bytes,
                                         unsigned char* __restrict__ stage, int scatter) {
    const unsigned long long p = blockIdx.x;
    const unsigned long long parts_per_block = 2ull * n_layers;
    const unsigned long long b = p / parts_per_block;
    const unsigned long long lk = p % parts_per_block;
    const unsigned long long id = table[parts_per_block + b];
    unsigned char* cache = (unsigned char*)table[lk] + id * part_bytes;
    unsigned char* staged = stage + p * part_bytes;
    const unsigned char* src = scatter ? staged : cache;
    unsigned char* dst = scatter ? cache : staged;
    if ((part_bytes & 15ull) == 0 && (((unsigned long long)src | (unsigned long long)dst) & 15ull) == 0) {
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        for (unsigned long long i = threadIdx.x; i < part_bytes / 16; i += blockDim.x) d[i] = s[i];
    } else {
        for (unsigned long long i = threadIdx.x; i < part_bytes; i += blockDim.x) dst[i] = src[i];
    }
}
