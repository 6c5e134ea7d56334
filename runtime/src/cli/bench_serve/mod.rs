//! `sov bench --url`: online serving benchmark of any OpenAI-compatible server (sov serve,
//! llama.cpp's llama-server, vLLM), in vLLM `bench serve` terms.
//!
//! Design: vLLM's `benchmarks/serve.py` with its "random" dataset. [`workload`] draws the prompts
//! from the model's tokenizer, [`arrivals`] the send times (Gamma gaps with the burstiness as
//! shape, or all at once), [`client`] streams each request over SSE ([`sse`], [`chunk`]) on a tokio
//! runtime with reqwest, at most `--concurrency` at a time, and [`report`] computes and prints the
//! metrics in vLLM's layout. One unmeasured request goes first to check the endpoint, as vLLM's
//! initial test run does.

pub mod arrivals;
pub mod chunk;
pub mod client;
pub mod report;
pub mod sse;
pub mod workload;

#[cfg(test)]
mod stub_tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::SeedableRng;

use self::arrivals::send_offsets;
use self::client::{Api, Outcome, RequestSettings};
use self::report::{OnlineResult, RunInfo};
use self::workload::{PromptFormat, WorkloadShape};
use super::bench_args::BenchArgs;

/// Joins the base URL and the endpoint (a URL already ending in the endpoint is kept).
pub fn endpoint_url(base: &str, endpoint: &str) -> String {
    let base = base.trim_end_matches('/');
    let endpoint = format!("/{}", endpoint.trim_start_matches('/'));
    if base.ends_with(&endpoint) {
        base.to_string()
    } else {
        format!("{base}{endpoint}")
    }
}

/// The server root: the URL without a trailing `/v1/...` endpoint.
fn server_root(base: &str) -> &str {
    let base = base.trim_end_matches('/');
    match base.find("/v1/") {
        Some(i) => &base[..i],
        None => base.strip_suffix("/v1").unwrap_or(base),
    }
}

/// Runs `sov bench --url`.
pub fn run(
    args: &BenchArgs,
    url: &str,
    dirs: &crate::app::SovDirs,
) -> anyhow::Result<std::process::ExitCode> {
    let online = &args.online;
    let api = if online
        .endpoint
        .trim_end_matches('/')
        .ends_with("chat/completions")
    {
        Api::Chat
    } else {
        Api::Completions
    };
    let format = online.prompt_format.unwrap_or(match api {
        Api::Chat => PromptFormat::Text,
        Api::Completions => PromptFormat::Ids,
    });
    anyhow::ensure!(
        !(api == Api::Chat && format == PromptFormat::Ids),
        "chat messages are text: use --prompt-format text with {}",
        online.endpoint
    );
    let tokenizer_path = match &online.tokenizer {
        Some(p) => p.clone(),
        None => crate::loader::resolve_model(None, &dirs.cache)?,
    };
    let tokenizer = workload::load_tokenizer(&tokenizer_path)
        .with_context(|| format!("loading the tokenizer from {}", tokenizer_path.display()))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let shape = WorkloadShape {
        num_prompts: args.num_prompts.max(1),
        input_len: args.input_len,
        output_len: args.output_len,
        range_ratio: args.random_range_ratio,
    };
    let text = (format == PromptFormat::Text).then_some(&tokenizer);
    let work = workload::build(shape, &workload::ordinary_ids(&tokenizer), text, &mut rng)?;
    let offsets = send_offsets(work.len(), online.request_rate, online.burstiness, &mut rng);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .context("building the HTTP client")?;
    let model = match &args.model.model {
        Some(m) => Some(m.clone()),
        None => runtime.block_on(first_model(&client, url, online.api_key.as_deref())),
    };
    let settings = Arc::new(RequestSettings {
        url: endpoint_url(url, &online.endpoint),
        model: model.clone(),
        api,
        temperature: args.temperature,
        filters: args.filters,
        api_key: online.api_key.clone(),
    });
    eprintln!("Traffic request rate: {}", online.request_rate);
    eprintln!(
        "Burstiness factor: {}{}",
        online.burstiness,
        if online.burstiness == 1.0 {
            " (Poisson process)"
        } else {
            ""
        }
    );
    match args.concurrency {
        Some(c) => eprintln!("Maximum request concurrency: {c}"),
        None => eprintln!("Maximum request concurrency: None"),
    }
    let info = RunInfo {
        url: settings.url.clone(),
        model: model.unwrap_or_default(),
        request_rate: online.request_rate.to_string(),
        burstiness: online.burstiness,
        max_concurrency: args.concurrency,
        slos: online.goodput.clone(),
    };
    let planned: Vec<usize> = work.iter().map(|w| w.ids.len()).collect();
    let (outcomes, duration) = runtime.block_on(async {
        let warm = client::send(&client, &settings, &work[0], Instant::now()).await;
        if !warm.success {
            anyhow::bail!(
                "the initial test request to {} failed: {}",
                settings.url,
                warm.error.unwrap_or_default()
            );
        }
        Ok(drive(&client, &settings, work, &offsets, args.concurrency).await)
    })?;
    let result = report::compute(info, &outcomes, &planned, duration);
    emit(args, &result)?;
    Ok(if result.failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}

/// Sends every request at its offset (waiting for a free slot under `concurrency`) and waits for
/// all; returns the outcomes in request order and the run's duration.
async fn drive(
    client: &reqwest::Client,
    settings: &Arc<RequestSettings>,
    work: Vec<workload::WorkItem>,
    offsets: &[f64],
    concurrency: Option<usize>,
) -> (Vec<Outcome>, Duration) {
    let limit = concurrency.map(|c| Arc::new(tokio::sync::Semaphore::new(c.max(1))));
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(work.len());
    for (item, offset) in work.into_iter().zip(offsets) {
        tokio::time::sleep_until((t0 + Duration::from_secs_f64(*offset)).into()).await;
        let permit = match &limit {
            Some(s) => Arc::clone(s).acquire_owned().await.ok(),
            None => None,
        };
        let (client, settings) = (client.clone(), Arc::clone(settings));
        tasks.push(tokio::spawn(async move {
            let out = client::send(&client, &settings, &item, t0).await;
            drop(permit);
            out
        }));
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        outcomes.push(task.await.unwrap_or_else(|e| Outcome {
            error: Some(format!("request task ended abnormally: {e}")),
            ..Outcome::default()
        }));
    }
    (outcomes, t0.elapsed())
}

/// The first model id the server lists under `/v1/models`, if it answers.
async fn first_model(client: &reqwest::Client, base: &str, key: Option<&str>) -> Option<String> {
    let mut req = client.get(format!("{}/v1/models", server_root(base)));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let v: serde_json::Value = req.send().await.ok()?.json().await.ok()?;
    v.get("data")?
        .get(0)?
        .get("id")?
        .as_str()
        .map(str::to_string)
}

/// Prints the report and writes the JSON where `--json` asks.
fn emit(args: &BenchArgs, result: &OnlineResult) -> anyhow::Result<()> {
    if !args.json_to_stdout() {
        report::print(result);
    }
    if let Some(e) = &result.first_error {
        eprintln!("sov: bench: first failed request: {e}");
    }
    args.write_json(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_join_and_root() {
        assert_eq!(
            endpoint_url("http://h:1/", "/v1/completions"),
            "http://h:1/v1/completions"
        );
        assert_eq!(
            endpoint_url("http://h:1/v1/completions", "v1/completions"),
            "http://h:1/v1/completions"
        );
        assert_eq!(server_root("http://h:1/v1/chat/completions"), "http://h:1");
        assert_eq!(server_root("http://h:1/v1"), "http://h:1");
        assert_eq!(server_root("http://h:1"), "http://h:1");
    }
}
