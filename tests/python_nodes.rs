//! Python nodes (python/node) that a launcher starts: the venv's python, and a node
//! command whose nodes each leave a mark (their pid and argv) in a folder, to tell what
//! the launcher ran, with which flags, and whether the process is gone afterwards.

use std::path::{Path, PathBuf};

/// The venv's python (`.venv` at the repository's root, which scripts/test.sh makes), or
/// `None` (with the reason on stderr) when the venv is missing.
pub fn venv_python() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} is missing; scripts/test.sh makes it (python3 -m venv .venv; pip install ./python/node pytest)",
            p.display()
        );
        None
    }
}

/// The module each marked node imports first (`--import`): it writes `node-<pid>` into
/// `$ROLLOUT_MARK_DIR` holding its argv, one word a line.
const MARK_MODULE: &str = r#"import os, sys
_d = os.environ["ROLLOUT_MARK_DIR"]
_p = os.path.join(_d, f"node-{os.getpid()}")
with open(_p + ".tmp", "w") as _f:
    _f.write("\n".join(sys.argv[1:]))
os.rename(_p + ".tmp", _p)
"#;

/// Python nodes started through `env` so that two words of the command hold a space
/// and a quote (the folders' names): a launcher that splits or mangles a word breaks
/// the run or leaves no mark.
pub struct MarkedPythonNodes {
    /// Where the marks go: a name with a space and a quote.
    marks: PathBuf,
    /// Where `rollout_mark.py` is (on the nodes' `PYTHONPATH`).
    module_dir: PathBuf,
}

/// What one marked node left.
#[derive(Debug)]
pub struct Mark {
    /// Its process id.
    pub pid: u32,
    /// Its arguments after the program (`--join ...`).
    pub args: Vec<String>,
}

impl MarkedPythonNodes {
    /// Makes the folders under `root`.
    pub fn new(root: &Path) -> MarkedPythonNodes {
        let marks = root.join("node marks' here");
        let module_dir = root.join("py path's dir");
        for d in [&marks, &module_dir] {
            std::fs::create_dir_all(d).expect("make a folder");
        }
        std::fs::write(module_dir.join("rollout_mark.py"), MARK_MODULE).expect("write the mark module");
        MarkedPythonNodes { marks, module_dir }
    }

    /// `env PYTHONPATH=.. ROLLOUT_MARK_DIR=.. PYTHON -m rollout_node --import rollout_mark`.
    pub fn command(&self, python: &Path) -> Vec<String> {
        vec![
            "env".into(),
            format!("PYTHONPATH={}", self.module_dir.display()),
            format!("ROLLOUT_MARK_DIR={}", self.marks.display()),
            python.display().to_string(),
            "-m".into(),
            "rollout_node".into(),
            "--import".into(),
            "rollout_mark".into(),
        ]
    }

    /// [`Self::command`] quoted for a POSIX shell (as `--node-command` takes it).
    pub fn shell_command(&self, python: &Path) -> String {
        self.command(python)
            .iter()
            .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Every mark so far, by pid.
    pub fn marks(&self) -> Vec<Mark> {
        let mut marks: Vec<Mark> = std::fs::read_dir(&self.marks)
            .expect("read the marks")
            .filter_map(|e| {
                let e = e.ok()?;
                let pid = e.file_name().to_str()?.strip_prefix("node-")?.parse().ok()?;
                let text = std::fs::read_to_string(e.path()).ok()?;
                Some(Mark {
                    pid,
                    args: text.lines().map(str::to_string).collect(),
                })
            })
            .collect();
        marks.sort_by_key(|m| m.pid);
        marks
    }
}

impl Mark {
    /// The value after `flag`, if given.
    pub fn flag(&self, flag: &str) -> Option<&str> {
        let i = self.args.iter().position(|a| a == flag)?;
        self.args.get(i + 1).map(String::as_str)
    }
}
