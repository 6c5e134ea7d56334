// step_trace.c: a CUPTI injection library that records the start and end of every kernel a
// process runs -- including each kernel node of a replayed CUDA graph, with programmatic
// dependent launch overlaps as they happened -- and writes them as CSV when the process exits.
// Nsight Compute replays each kernel alone, so it cannot show what a decode step's kernels cost
// together; this can (bench/gpu-step-trace.sh reads the CSV).
// Build (the GPU machine; CUPTI ships with the CUDA toolkit; bench/gpu-step-trace.sh does it):
//   gcc -O2 -shared -fPIC -I$CUDA/include -I$CUDA/extras/CUPTI/include step_trace.c
//       -L$CUDA/extras/CUPTI/lib64 -lcupti -o libsteptrace.so
// Use: CUDA_INJECTION64_PATH=/abs/libsteptrace.so STEP_TRACE_OUT=trace.csv <any CUDA program>
// CSV columns: start_ns,end_ns,grid_x,grid_y,block_x,graph_id,name (one kernel a line).
// With STEP_TRACE_HOST=host.csv it also records, on the same clock, every CUDA driver API call
// (host side: the thread's time inside the driver) and every memset and memcpy the GPU ran, so
// step_report.py's `gaps` mode can say what the host did while the GPU idled between passes.
// host.csv columns: kind,start_ns,end_ns,thread,bytes,name (kind: api, memset or memcpy). Driver
// API tracing costs the host about a microsecond a call, so it is off unless asked for.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#define BUFFER_BYTES (16u << 20)

static FILE* trace_out;
static FILE* host_out;

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = (uint8_t*)aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity* rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_DRIVER && host_out) {
            const CUpti_ActivityAPI* a = (const CUpti_ActivityAPI*)rec;
            const char* name = NULL;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name) != CUPTI_SUCCESS) name = NULL;
            fprintf(host_out, "api,%llu,%llu,%u,0,%s\n", (unsigned long long)a->start, (unsigned long long)a->end,
                    a->threadId, name ? name : "?");
            continue;
        }
        if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET && host_out) {
            const CUpti_ActivityMemset4* m = (const CUpti_ActivityMemset4*)rec;
            fprintf(host_out, "memset,%llu,%llu,0,%llu,memset\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, (unsigned long long)m->bytes);
            continue;
        }
        if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY && host_out) {
            const CUpti_ActivityMemcpy6* m = (const CUpti_ActivityMemcpy6*)rec;
            fprintf(host_out, "memcpy,%llu,%llu,0,%llu,memcpy kind %u\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, (unsigned long long)m->bytes, (unsigned)m->copyKind);
            continue;
        }
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)rec;
        if (trace_out)
            fprintf(trace_out, "%llu,%llu,%d,%d,%d,%u,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                    k->gridX, k->gridY, k->blockX, k->graphId, k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "step_trace: %zu records dropped\n", dropped);
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (trace_out) fclose(trace_out);
    trace_out = NULL;
    if (host_out) fclose(host_out);
    host_out = NULL;
}

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
int InitializeInjection(void) {
    const char* path = getenv("STEP_TRACE_OUT");
    trace_out = fopen(path ? path : "step_trace.csv", "w");
    if (!trace_out) {
        fprintf(stderr, "step_trace: cannot open %s\n", path ? path : "step_trace.csv");
        return 0;
    }
    fprintf(trace_out, "start_ns,end_ns,grid_x,grid_y,block_x,graph_id,name\n");
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "step_trace: CUPTI activity tracing unavailable\n");
        return 0;
    }
    const char* host_path = getenv("STEP_TRACE_HOST");
    if (host_path && *host_path) {
        host_out = fopen(host_path, "w");
        if (!host_out) {
            fprintf(stderr, "step_trace: cannot open %s\n", host_path);
        } else {
            fprintf(host_out, "kind,start_ns,end_ns,thread,bytes,name\n");
            if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS ||
                cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS ||
                cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS)
                fprintf(stderr, "step_trace: host-side activity tracing unavailable\n");
        }
    }
    atexit(flush_at_exit);
    return 1;
}
