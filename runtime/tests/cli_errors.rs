//! Bad input through the `sov` binary: a clear error on stderr and a non-zero exit, never a panic.
//! Runs on the random tiny model (no download needed).

use std::process::Command;

const SOV: &str = env!("CARGO_BIN_EXE_sov");

fn sov(args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(SOV)
        .args(args)
        .env("SOV_STATE_DIR", dir.path())
        .output()
        .expect("sov runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked"),
        "sov {args:?} panicked: {stderr}"
    );
    (out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn bad_input_gives_clear_errors() {
    let tiny = ["generate", "--model", "random:tiny"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "generate",
                "--model",
                "/no/such/model.gguf",
                "--prompt",
                "hi",
            ],
            "/no/such/model.gguf",
        ),
        (
            vec![
                "generate",
                "--model",
                "no-such-model-name",
                "--prompt",
                "hi",
            ],
            "no-such-model-name",
        ),
        ([&tiny[..], &["--prompt", ""]].concat(), "prompt is empty"),
        (
            [&tiny[..], &["--prompt", "hi", "--max-tokens", "0"]].concat(),
            "max_tokens",
        ),
        (
            [&tiny[..], &["--prompt", "hi", "--temperature=-1"]].concat(),
            "temperature",
        ),
        (
            [&tiny[..], &["--prompt", "hi", "--top-p", "1.5"]].concat(),
            "top_p",
        ),
        (
            [
                &tiny[..],
                &["--prompt", "hello world", "--max-context", "4"],
            ]
            .concat(),
            "context",
        ),
        ([&tiny[..], &["--chat", "hi"]].concat(), "chat template"),
        (
            [&tiny[..], &["--prompt", "hi", "--precision", "f64"]].concat(),
            "possible values: bf16, f32",
        ),
        (
            vec!["slots", "get", "--file", "/no/such/slots"],
            "/no/such/slots",
        ),
        (
            vec!["slots", "set", "no_such_slot", "1", "--file", "/dev/null"],
            "slot",
        ),
    ];
    for (args, needle) in cases {
        let (code, stderr) = sov(&args);
        assert_ne!(code, 0, "sov {args:?} succeeded");
        assert!(
            stderr.to_lowercase().contains(&needle.to_lowercase()),
            "sov {args:?}: stderr lacks `{needle}`:\n{stderr}"
        );
    }
    // And a good request still works on the same build, with either precision (the CPU always
    // computes in f32, so `--precision` changes nothing there).
    for precision in ["bf16", "f32"] {
        let (code, stderr) = sov(&[
            &tiny[..],
            &[
                "--prompt",
                "hi",
                "--max-tokens",
                "5",
                "--json",
                "--device",
                "cpu",
                "--precision",
                precision,
            ],
        ]
        .concat());
        assert_eq!(code, 0, "{stderr}");
    }
}
