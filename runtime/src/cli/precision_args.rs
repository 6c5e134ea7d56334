//! The number formats a run computes in, from its [`ModelArgs`]: FP8 products
//! (`--quantization`, `--fp8-edge-layers`) and the KV cache's format (`--kv-dtype`), checked
//! against the device and the model and written into the CUDA tuning.
//!
//! Design: the command line says what the user asked for; these functions decide what applies
//! (an FP8 checkpoint runs FP8 on CUDA whatever was asked) and refuse, with the option's name,
//! what cannot (FP8 on the CPU's cache, FP8 with `--deterministic`), before any weight loads.

use crate::app::start::{Device, ModelParts};
use crate::backend::cuda::{CudaTuning, Quantization};

use super::model_args::{KvDtypeChoice, ModelArgs, PrecisionChoice, QuantizationChoice};

impl ModelArgs {
    /// Whether the linear layers multiply in FP8: `--quantization fp8`, or an FP8 checkpoint on
    /// CUDA (its codes multiply as they are; the CPU widens them to f32).
    pub(super) fn fp8_products(&self, parts: &ModelParts, device: Device) -> bool {
        let fp8_checkpoint = parts.has_fp8_weights() && matches!(device, Device::Cuda(_));
        self.quantization == QuantizationChoice::Fp8 || fp8_checkpoint
    }

    /// The products' format for `parts` on `device` ([`Self::fp8_products`]), or why FP8 cannot
    /// run with the other options.
    fn quantization_for(
        &self,
        parts: &ModelParts,
        device: Device,
        deterministic: bool,
    ) -> anyhow::Result<Quantization> {
        if !self.fp8_products(parts, device) {
            return Ok(Quantization::None);
        }
        let what = if parts.has_fp8_weights() && matches!(device, Device::Cuda(_)) {
            "an FP8 checkpoint on CUDA (its weights multiply in FP8)"
        } else {
            "--quantization fp8"
        };
        anyhow::ensure!(
            matches!(device, Device::Cuda(_)),
            "{what} needs a CUDA device (the CPU backend has no FP8 products)"
        );
        anyhow::ensure!(
            self.precision == PrecisionChoice::Bf16,
            "{what} cannot be combined with --precision f32"
        );
        anyhow::ensure!(
            !deterministic,
            "{what} cannot be combined with --deterministic (FP8 products are not \
             batch-invariant yet)"
        );
        Ok(Quantization::Fp8W8A8)
    }

    /// Sets `tuning`'s products format ([`Self::quantization_for`], given its deterministic
    /// choice), the layers FP8 leaves in bf16 (`--fp8-edge-layers`; none named for an FP8
    /// checkpoint, whose weights upload as they are) and the KV cache's format
    /// ([`Self::kv_e4m3_for`]; `run_kv_e4m3`: the run resumed or replayed kept an e4m3 cache).
    pub(super) fn set_quantization(
        &self,
        tuning: &mut CudaTuning,
        parts: &ModelParts,
        device: Device,
        run_kv_e4m3: bool,
    ) -> anyhow::Result<()> {
        tuning.quantization = self.quantization_for(parts, device, tuning.deterministic)?;
        tuning.fp8_bf16_edge_layers =
            self.fp8_edge_layers_for(tuning.quantization, parts.has_fp8_weights())?;
        tuning.kv_e4m3 = self.kv_e4m3_for(device, run_kv_e4m3)?;
        Ok(())
    }

    /// Whether the KV cache holds e4m3: `--kv-dtype fp8`, or without `--kv-dtype` a resumed or
    /// replayed run that kept one (`run_kv_e4m3`) where this device and precision can; an error
    /// for `--kv-dtype fp8` where they cannot.
    pub(super) fn kv_e4m3_for(&self, device: Device, run_kv_e4m3: bool) -> anyhow::Result<bool> {
        let cuda_bf16 = matches!(device, Device::Cuda(_)) && self.precision != PrecisionChoice::F32;
        match self.kv_dtype {
            Some(KvDtypeChoice::Bf16) => return Ok(false),
            None => return Ok(run_kv_e4m3 && cuda_bf16),
            Some(KvDtypeChoice::Fp8) => {}
        }
        anyhow::ensure!(
            matches!(device, Device::Cuda(_)),
            "--kv-dtype fp8 needs a CUDA device (the CPU keeps an f32 cache)"
        );
        anyhow::ensure!(
            self.precision != PrecisionChoice::F32,
            "--kv-dtype fp8 cannot be combined with --precision f32 (whose cache is f32)"
        );
        Ok(true)
    }

    /// The layers at each end that FP8 leaves in bf16 (`--fp8-edge-layers`, else the tuning's
    /// default) when the products are FP8 quantized at load, 0 otherwise; an error when the
    /// option was given but does not apply.
    fn fp8_edge_layers_for(
        &self,
        quantization: Quantization,
        fp8_checkpoint: bool,
    ) -> anyhow::Result<usize> {
        let at_load = quantization == Quantization::Fp8W8A8 && !fp8_checkpoint;
        match (self.fp8_edge_layers, at_load) {
            (None, true) => Ok(CudaTuning::default().fp8_bf16_edge_layers),
            (None, false) => Ok(0),
            (Some(n), true) => Ok(n),
            (Some(_), false) if fp8_checkpoint => anyhow::bail!(
                "--fp8-edge-layers does not apply to an FP8 checkpoint (its weights run as it \
                 has them)"
            ),
            (Some(_), false) => {
                anyhow::bail!("--fp8-edge-layers applies only with --quantization fp8")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
    }

    fn parse(args: &[&str]) -> ModelArgs {
        let mut all = vec!["sov"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap().model
    }

    #[test]
    fn fp8_edge_layers_apply_only_to_fp8_quantized_at_load() {
        let (fp8, none) = (Quantization::Fp8W8A8, Quantization::None);
        let a = parse(&[]);
        assert_eq!(a.fp8_edge_layers_for(fp8, false).unwrap(), 1);
        assert_eq!(a.fp8_edge_layers_for(fp8, true).unwrap(), 0);
        assert_eq!(a.fp8_edge_layers_for(none, false).unwrap(), 0);
        let a = parse(&["--fp8-edge-layers", "0"]);
        assert_eq!(a.fp8_edge_layers_for(fp8, false).unwrap(), 0);
        let e = a.fp8_edge_layers_for(none, false).unwrap_err().to_string();
        assert!(e.contains("only with --quantization fp8"), "{e}");
        let e = a.fp8_edge_layers_for(fp8, true).unwrap_err().to_string();
        assert!(e.contains("FP8 checkpoint"), "{e}");
        assert!(Cli::try_parse_from(["sov", "--fp8-edge-layers", "-1"]).is_err());
    }

    #[test]
    fn an_fp8_kv_cache_is_for_cuda_in_bf16_precision() {
        let gpu = Device::Cuda(0);
        assert!(!parse(&[]).kv_e4m3_for(gpu, false).unwrap());
        let a = parse(&["--kv-dtype", "fp8"]);
        assert!(a.kv_e4m3_for(gpu, false).unwrap());
        let e = a.kv_e4m3_for(Device::Cpu, false).unwrap_err().to_string();
        assert!(e.contains("needs a CUDA device"), "{e}");
        // A resumed or replayed run keeps its e4m3 cache where it can, unless told otherwise.
        assert!(parse(&[]).kv_e4m3_for(gpu, true).unwrap());
        assert!(!parse(&[]).kv_e4m3_for(Device::Cpu, true).unwrap());
        assert!(
            !parse(&["--precision", "f32"])
                .kv_e4m3_for(gpu, true)
                .unwrap()
        );
        assert!(
            !parse(&["--kv-dtype", "bf16"])
                .kv_e4m3_for(gpu, true)
                .unwrap()
        );
        let a = parse(&["--kv-dtype", "fp8", "--precision", "f32"]);
        let e = a.kv_e4m3_for(gpu, false).unwrap_err().to_string();
        assert!(e.contains("--precision f32"), "{e}");
        assert!(Cli::try_parse_from(["sov", "--kv-dtype", "int8"]).is_err());
    }
}
