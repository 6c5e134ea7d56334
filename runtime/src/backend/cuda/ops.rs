//! Launches of the element-wise and row kernels (`elementwise.cu`, `rope_kv.cu`).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::{KernelId, KvElement};

use super::buffer::CudaBuffer;
use super::device::{CudaBackend, grid_for};
use super::driver_error::driver_err;
use super::pdl::arg;
use crate::backend::{
    BackendError, DType, HeadShape, KvLayer, NewTokens, RmsNorm, RopeTables, check_buffer,
};

/// The gate/up rows a SiLU-mul reads (`[n, 2f]`): f32, or bf16 where an FP8 product wrote them so
/// ([`super::CudaTuning::fp8_gate_up_bf16`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct GateUpRows {
    /// Device address of element 0.
    pub(super) ptr: u64,
    /// Whether the elements are bf16 (else f32).
    pub(super) bf16: bool,
}

impl GateUpRows {
    /// The f32 rows of `b`.
    pub(super) fn f32(b: &CudaBuffer) -> Self {
        Self {
            ptr: b.ptr(),
            bf16: false,
        }
    }
}

/// `v` as a kernel `int`, or an error naming `what`.
pub(super) fn to_i32(v: usize, what: &str) -> Result<i32, BackendError> {
    i32::try_from(v).map_err(|_| BackendError::Unsupported(format!("{what} = {v} exceeds i32")))
}

fn grid_stride(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_for(n, 256), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(super) fn per_row(rows: usize, width: usize) -> LaunchConfig {
    let threads = width.div_ceil(32).clamp(1, 32) as u32 * 32;
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Float4 groups a thread of an RMSNorm row keeps (`RMS_VEC_KEEP` in `elementwise.cu`).
const RMS_VEC_KEEP: usize = 4;

/// One CTA per RMSNorm row: where `width % 4 == 0`, the kernels' vector form, a thread owning
/// `RMS_VEC_KEEP` float4 groups (256 threads for 4096: several CTAs an SM overlap each other's
/// loads and reductions), else `per_row`'s one element a thread. The CTA size fixes the order of
/// the row's sum of squares, so it depends on the width alone, never on the row count: a row's
/// bits must not depend on its batch (`--deterministic`), and the e4m3 form must give the bits of
/// the bf16 form at any row count.
pub(super) fn rms_norm_config(rows: usize, width: usize) -> LaunchConfig {
    if !width.is_multiple_of(4) {
        return per_row(rows, width);
    }
    let threads = (width / 4).div_ceil(RMS_VEC_KEEP).div_ceil(32).clamp(1, 32) as u32 * 32;
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Checks the activation, positions and tables of a RoPE (`qkv: [n, qkv_width]` f32, positions
/// `[n]` u32, cos/sin `[max_pos, D/2]` f32).
pub(super) fn check_rope_args(
    op: &'static str,
    qkv: &CudaBuffer,
    positions: &CudaBuffer,
    tables: RopeTables<'_, CudaBackend>,
    n: usize,
    heads: HeadShape,
) -> Result<(), BackendError> {
    check_buffer(op, "qkv", qkv, DType::F32, n * heads.qkv_width())?;
    check_buffer(op, "positions", positions, DType::U32, n)?;
    check_buffer(op, "cos", tables.cos, DType::F32, heads.head_dim / 2)?;
    check_buffer(op, "sin", tables.sin, DType::F32, tables.cos.len)
}

impl CudaBackend {
    pub(super) fn embedding_impl(
        &self,
        table: &CudaBuffer,
        ids: &CudaBuffer,
        out: &mut CudaBuffer,
        n: usize,
        hidden: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "embedding";
        if table.dtype != DType::BF16 {
            return Err(BackendError::Unsupported(format!(
                "{OP} table of dtype {:?}",
                table.dtype
            )));
        }
        let vocab = table.len / hidden.max(1);
        if vocab == 0 {
            return Err(BackendError::Shape {
                op: OP,
                detail: "empty table".into(),
            });
        }
        check_buffer(OP, "ids", ids, DType::U32, n)?;
        check_buffer(OP, "out", out, DType::F32, n * hidden)?;
        if n == 0 {
            return Ok(());
        }
        let f = self
            .modules
            .function(KernelId::Elementwise, None, "embedding_gather")?;
        let (d, v) = (to_i32(hidden, "hidden")?, to_i32(vocab, "vocab")?);
        let (o, t, i) = (out.ptr(), table.ptr(), ids.ptr());
        let mut params = [arg(&o), arg(&t), arg(&i), arg(&d), arg(&v)];
        // SAFETY: buffers checked above; argument list matches embedding_gather.
        // The kernel waits for its prerequisites before touching them (super::pdl).
        unsafe { self.launch_overlapping(&f, per_row(n, hidden), &mut params) }?;
        Ok(())
    }

    /// RMSNorm of `residual` (after adding `delta` into it when given: `add_rms_norm`) into `out`.
    pub(super) fn rms_norm_impl(
        &self,
        residual: u64,
        delta: Option<&CudaBuffer>,
        norm: RmsNorm<'_, CudaBackend>,
        out: &mut CudaBuffer,
        n: usize,
        d: usize,
    ) -> Result<(), BackendError> {
        let op = if delta.is_some() {
            "add_rms_norm"
        } else {
            "rms_norm"
        };
        let RmsNorm { weight, eps } = norm;
        check_buffer(op, "weight", weight, DType::F32, d)?;
        // A delta in bf16 (an FP8 product written so: `matmul_residual_delta_impl`) takes the
        // kernels' `_dbf16` twins.
        let delta_bf16 = delta.is_some_and(|x| x.dtype == DType::BF16);
        if let Some(x) = delta {
            let dtype = if delta_bf16 { DType::BF16 } else { DType::F32 };
            check_buffer(op, "x", x, dtype, n * d)?;
        }
        if out.dtype == DType::F8E4M3 {
            if n == 0 {
                return Ok(());
            }
            let delta = delta.map_or(0u64, |b| b.ptr());
            return self.rms_norm_e4m3(op, (residual, delta, delta_bf16), norm, out, (n, d));
        }
        let name = match (out.dtype, delta_bf16) {
            (DType::BF16, false) => "rmsnorm_residual_bf16",
            (DType::BF16, true) => "rmsnorm_residual_bf16_dbf16",
            (_, false) => "rmsnorm_residual",
            (_, true) => "rmsnorm_residual_dbf16",
        };
        check_product_input(op, "out", out, n * d)?;
        if n == 0 {
            return Ok(());
        }
        let f = self.modules.function(KernelId::Elementwise, None, name)?;
        let di = to_i32(d, "d")?;
        let (o, w) = (out.ptr(), weight.ptr());
        let x = delta.map_or(0u64, |b| b.ptr());
        let mut params = [
            arg(&o),
            arg(&residual),
            arg(&x),
            arg(&w),
            arg(&di),
            arg(&eps),
        ];
        // SAFETY: sizes checked above (residual by the caller); a null delta means plain RMSNorm,
        // in which case the kernel never writes `residual`.
        // The kernel waits for its prerequisites before touching them (super::pdl).
        unsafe { self.launch_overlapping(&f, rms_norm_config(n, d), &mut params) }?;
        Ok(())
    }

    pub(super) fn add_bias_impl(
        &self,
        x: &mut CudaBuffer,
        bias: &CudaBuffer,
        n: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "add_bias";
        check_buffer(OP, "x", x, DType::F32, n * m)?;
        check_buffer(OP, "bias", bias, DType::F32, m)?;
        if n * m == 0 {
            return Ok(());
        }
        let f = self
            .modules
            .function(KernelId::Elementwise, None, "add_bias")?;
        let (ni, mi) = (to_i32(n, "n")?, to_i32(m, "m")?);
        let (xp, bp) = (x.ptr(), bias.ptr());
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&bp).arg(&ni).arg(&mi);
        // SAFETY: sizes checked above.
        unsafe { b.launch(grid_stride(n * m)) }.map_err(driver_err)?;
        Ok(())
    }

    /// Checks the slot mapping and the two caches of a KV write (cache dtype by mode).
    pub(super) fn check_kv_write_args(
        &self,
        op: &'static str,
        slot_mapping: &CudaBuffer,
        kv: KvLayer<&CudaBuffer>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        check_buffer(op, "slot_mapping", slot_mapping, DType::U32, n)?;
        let kv_dtype = self.kv_dtype_impl();
        check_buffer(op, "k_cache", kv.k, kv_dtype, self.kv_row_elems_impl(heads))?;
        check_buffer(op, "v_cache", kv.v, kv_dtype, kv.k.len)
    }

    pub(super) fn rope_impl(
        &self,
        qkv: &mut CudaBuffer,
        positions: &CudaBuffer,
        tables: RopeTables<'_, CudaBackend>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        let half = heads.head_dim / 2;
        check_rope_args("rope", qkv, positions, tables, n, heads)?;
        let RopeTables { cos, sin } = tables;
        if n == 0 {
            return Ok(());
        }
        let f = self
            .modules
            .function(KernelId::RopeKv, None, "rope_inplace")?;
        let rot = heads.n_heads + heads.n_kv_heads;
        let (ni, ri, di, si) = (
            to_i32(n, "n")?,
            to_i32(rot, "heads")?,
            to_i32(heads.head_dim, "head_dim")?,
            to_i32(heads.qkv_width(), "qkv width")?,
        );
        let (q, p, c, s) = (qkv.ptr(), positions.ptr(), cos.ptr(), sin.ptr());
        let mut b = self.stream.launch_builder(&f);
        b.arg(&q)
            .arg(&p)
            .arg(&c)
            .arg(&s)
            .arg(&ni)
            .arg(&ri)
            .arg(&di)
            .arg(&si);
        // SAFETY: sizes checked above; positions index rows of the tables, which the model sizes to
        // its max position (an out-of-range position is the caller's contract violation).
        unsafe { b.launch(grid_stride(n * rot * half)) }.map_err(driver_err)?;
        Ok(())
    }

    pub(super) fn kv_write_impl(
        &self,
        qkv: &CudaBuffer,
        slot_mapping: &CudaBuffer,
        kv: KvLayer<&mut CudaBuffer>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        const OP: &str = "kv_write";
        check_buffer(OP, "qkv", qkv, DType::F32, n * heads.qkv_width())?;
        self.check_kv_write_args(OP, slot_mapping, kv.as_shared(), n, heads)?;
        if self.kv_element() == KvElement::E4m3 {
            return self.write_kv_e4m3(qkv, slot_mapping, None, kv, n, heads);
        }
        let KvLayer {
            k: k_cache,
            v: v_cache,
        } = kv;
        if !heads.kv_width().is_multiple_of(8) {
            return Err(BackendError::Unsupported(format!(
                "{OP}: KVH * D = {} not a multiple of 8",
                heads.kv_width()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let (name, per_thread) = if self.precise {
            ("kv_write_f32", 4)
        } else {
            ("kv_write", 8)
        };
        let f = self.modules.function(KernelId::RopeKv, None, name)?;
        let (ni, qw, kw, rs) = (
            to_i32(n, "n")?,
            to_i32(heads.q_width(), "q width")?,
            to_i32(heads.kv_width(), "kv width")?,
            to_i32(heads.qkv_width(), "qkv width")?,
        );
        let (kc, vc, q, s) = (k_cache.ptr(), v_cache.ptr(), qkv.ptr(), slot_mapping.ptr());
        let mut b = self.stream.launch_builder(&f);
        b.arg(&kc)
            .arg(&vc)
            .arg(&q)
            .arg(&s)
            .arg(&ni)
            .arg(&qw)
            .arg(&kw)
            .arg(&rs);
        // SAFETY: sizes checked above; slots are allocated by the engine inside the cache.
        unsafe { b.launch(grid_stride(n * heads.kv_width() / per_thread)) }.map_err(driver_err)?;
        Ok(())
    }

    /// `rope_impl` then `kv_write_impl` in one launch (`rope_kv_write` in `rope_kv.cu`).
    pub(super) fn rope_kv_write_impl(
        &self,
        qkv: &mut CudaBuffer,
        tokens: NewTokens<'_, CudaBackend>,
        tables: RopeTables<'_, CudaBackend>,
        kv: KvLayer<&mut CudaBuffer>,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        const OP: &str = "rope_kv_write";
        let half = heads.head_dim / 2;
        let NewTokens {
            positions,
            slots: slot_mapping,
            n,
        } = tokens;
        check_rope_args(OP, qkv, positions, tables, n, heads)?;
        self.check_kv_write_args(OP, slot_mapping, kv.as_shared(), n, heads)?;
        if self.kv_element() == KvElement::E4m3 {
            return self.write_kv_e4m3(qkv, slot_mapping, Some((positions, tables)), kv, n, heads);
        }
        let (
            RopeTables { cos, sin },
            KvLayer {
                k: k_cache,
                v: v_cache,
            },
        ) = (tables, kv);
        if n == 0 {
            return Ok(());
        }
        let name = if self.precise {
            "rope_kv_write_f32"
        } else {
            "rope_kv_write"
        };
        let f = self.modules.function(KernelId::RopeKv, None, name)?;
        let all_heads = heads.n_heads + 2 * heads.n_kv_heads;
        let (ni, hi, kvi, di, si) = (
            to_i32(n, "n")?,
            to_i32(heads.n_heads, "heads")?,
            to_i32(heads.n_kv_heads, "kv heads")?,
            to_i32(heads.head_dim, "head_dim")?,
            to_i32(heads.qkv_width(), "qkv width")?,
        );
        let (q, kc, vc) = (qkv.ptr(), k_cache.ptr(), v_cache.ptr());
        let (p, c, s, sl) = (positions.ptr(), cos.ptr(), sin.ptr(), slot_mapping.ptr());
        let mut params = [
            arg(&q),
            arg(&kc),
            arg(&vc),
            arg(&p),
            arg(&c),
            arg(&s),
            arg(&sl),
            arg(&ni),
            arg(&hi),
            arg(&kvi),
            arg(&di),
            arg(&si),
        ];
        // SAFETY: sizes checked above; positions index rows of the tables (the model sizes them to
        // its max position) and slots are allocated by the engine inside the cache.
        // The kernel waits for its prerequisites before touching them (super::pdl).
        unsafe { self.launch_overlapping(&f, grid_stride(n * all_heads * half), &mut params) }?;
        Ok(())
    }

    pub(super) fn silu_mul_impl(
        &self,
        gate_up: &CudaBuffer,
        out: &mut CudaBuffer,
        n: usize,
        f: usize,
    ) -> Result<(), BackendError> {
        check_buffer("silu_mul", "gate_up", gate_up, DType::F32, n * 2 * f)?;
        // SAFETY: gate_up holds n*2f f32 (checked above).
        unsafe { self.silu_mul_from(GateUpRows::f32(gate_up), out, n, f) }
    }

    /// [`Self::silu_mul_impl`] from gate/up rows in f32 or bf16.
    ///
    /// # Safety
    /// `gate_up` must address `n * 2f` elements of its type, live until the launch has run.
    pub(super) unsafe fn silu_mul_from(
        &self,
        gate_up: GateUpRows,
        out: &mut CudaBuffer,
        n: usize,
        f: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "silu_mul";
        if out.dtype == DType::F8E4M3 {
            if n * f == 0 {
                return Ok(());
            }
            // SAFETY: the caller's contract on gate_up.
            return unsafe { self.silu_mul_e4m3(gate_up, out, n, f) };
        }
        check_product_input(OP, "out", out, n * f)?;
        if n * f == 0 {
            return Ok(());
        }
        let name = match (out.dtype, gate_up.bf16) {
            (DType::BF16, false) => "silu_mul_bf16",
            (DType::BF16, true) => "silu_mul_bf16_from_bf16",
            (_, false) => "silu_mul",
            (_, true) => "silu_mul_from_bf16",
        };
        let func = self.modules.function(KernelId::Elementwise, None, name)?;
        let (ni, fi) = (to_i32(n, "n")?, to_i32(f, "f")?);
        let (o, g) = (out.ptr(), gate_up.ptr);
        let mut params = [arg(&o), arg(&g), arg(&ni), arg(&fi)];
        // Rows along y (the kernel strides past the grid's 65535), a row's columns along x, four a
        // thread.
        let cfg = LaunchConfig {
            grid_dim: (grid_for(f.div_ceil(4), 256), n.min(65535) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: out checked above, gate_up the caller's contract.
        // The kernel waits for its prerequisites before touching them (super::pdl).
        unsafe { self.launch_overlapping(&func, cfg, &mut params) }?;
        Ok(())
    }

    pub(super) fn gather_rows_impl(
        &self,
        x: &CudaBuffer,
        rows: &CudaBuffer,
        out: &mut CudaBuffer,
        r: usize,
        d: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "gather_rows";
        check_product_input(OP, "x", x, d)?;
        check_buffer(OP, "rows", rows, DType::U32, r)?;
        check_buffer(OP, "out", out, DType::F32, r * d)?;
        if r == 0 {
            return Ok(());
        }
        let name = match x.dtype {
            DType::BF16 => "gather_rows_bf16",
            _ => "gather_rows",
        };
        let f = self.modules.function(KernelId::Elementwise, None, name)?;
        let di = to_i32(d, "d")?;
        let (o, xp, rp) = (out.ptr(), x.ptr(), rows.ptr());
        let mut params = [arg(&o), arg(&xp), arg(&rp), arg(&di)];
        // SAFETY: sizes checked above; row indices are < n by the op's contract.
        // The kernel waits for its prerequisites before touching them (super::pdl).
        unsafe { self.launch_overlapping(&f, per_row(r, d), &mut params) }?;
        Ok(())
    }
}

impl CudaBackend {
    /// Fills a bf16 buffer with `scale * U[-1, 1)` from a hash of (seed, index), on the device
    /// (benchmark weights and caches without a host round trip).
    pub fn fill_random_bf16(
        &self,
        buf: &mut CudaBuffer,
        seed: u32,
        scale: f32,
    ) -> Result<(), BackendError> {
        if buf.dtype != DType::BF16 {
            return Err(BackendError::Unsupported(format!(
                "fill_random_bf16 on {:?}",
                buf.dtype
            )));
        }
        let f = self
            .modules
            .function(KernelId::Elementwise, None, "fill_random_bf16")?;
        let (p, n) = (buf.ptr(), buf.len);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&p).arg(&n).arg(&seed).arg(&scale);
        // SAFETY: writes exactly buf.len bf16 elements.
        unsafe { b.launch(grid_stride(n)) }.map_err(driver_err)?;
        Ok(())
    }
}

/// Checks a buffer that holds (or receives) a matrix-product input: f32, or bf16 as
/// [`crate::backend::Backend::matmul_input_dtype`] allows; `need` elements either way.
fn check_product_input(
    op: &'static str,
    name: &'static str,
    buf: &CudaBuffer,
    need: usize,
) -> Result<(), BackendError> {
    let dtype = match buf.dtype {
        DType::BF16 => DType::BF16,
        _ => DType::F32,
    };
    check_buffer(op, name, buf, dtype, need)
}

#[cfg(test)]
mod launch_tests {
    use super::rms_norm_config;

    /// The CTA size of an RMSNorm row fixes the order of its sum of squares, so a row's bits may
    /// depend on its width only: a batch of any size (fewer rows than SMs, or many more) must
    /// launch it alike, or `--deterministic` runs would depend on their batch.
    #[test]
    fn rms_norm_threads_do_not_depend_on_the_row_count() {
        for width in [64, 576, 1000, 1001, 4096, 5000, 8192, 16388] {
            let one = rms_norm_config(1, width).block_dim;
            for rows in [2, 16, 131, 132, 133, 264, 1024, 4096] {
                assert_eq!(
                    rms_norm_config(rows, width).block_dim,
                    one,
                    "width {width}, {rows} rows"
                );
            }
        }
        // The vector form: 4 float4 groups a thread, whole warps.
        assert_eq!(rms_norm_config(7, 4096).block_dim, (256, 1, 1));
        assert_eq!(rms_norm_config(7, 64).block_dim, (32, 1, 1));
    }
}
