//! A stand-in for the Hugging Face hub, as a model download sees it: every model id
//! resolves, a revision that is a branch or tag resolves to a commit derived from the
//! model and the revision (a 40-hex revision is its own commit), and a snapshot holds a
//! few small files whose bytes are a function of the model and the commit. The sim's
//! download containers "download" these, so what lands in the bucket is checkable.

use sha2::{Digest, Sha256};

use crate::world::{fnv1a, fnv1a_extend};

/// One file of a snapshot.
pub struct File {
    pub path: String,
    pub bytes: Vec<u8>,
}

pub struct Snapshot {
    pub commit: String,
    pub files: Vec<File>,
}

/// The commit `revision` of `model` resolves to.
pub fn commit(model: &str, revision: &str) -> String {
    if revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit()) {
        return revision.to_ascii_lowercase();
    }
    let mut h = fnv1a(model);
    let mut out = String::new();
    while out.len() < 40 {
        h = fnv1a_extend(h, revision.as_bytes());
        out.push_str(&format!("{h:016x}"));
    }
    out.truncate(40);
    out
}

/// The files of `model` at `revision`.
pub fn snapshot(model: &str, revision: &str) -> Snapshot {
    let commit = commit(model, revision);
    let config = format!(
        "{{\"_name_or_path\": \"{model}\", \"architectures\": [\"LlamaForCausalLM\"], \"torch_dtype\": \"bfloat16\", \"_commit\": \"{commit}\"}}\n"
    );
    // Weights: deterministic bytes, a few kilobytes, so sizes and digests mean something.
    let mut weights = Vec::with_capacity(4096);
    let mut h = fnv1a(&commit);
    while weights.len() < 4096 {
        h = fnv1a_extend(h, &h.to_le_bytes());
        weights.extend_from_slice(&h.to_le_bytes());
    }
    let files = vec![
        File {
            path: "config.json".into(),
            bytes: config.into_bytes(),
        },
        File {
            path: "generation_config.json".into(),
            bytes: b"{\"do_sample\": true, \"temperature\": 0.6}\n".to_vec(),
        },
        File {
            path: "model.safetensors".into(),
            bytes: weights,
        },
        File {
            path: "tokenizer.json".into(),
            bytes: format!("{{\"model\": {{\"type\": \"BPE\"}}, \"_for\": \"{model}\"}}\n")
                .into_bytes(),
        },
    ];
    Snapshot { commit, files }
}

/// The SHA-256 of `bytes`, hex: what the download records beside each file.
pub fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_resolve_to_stable_commits() {
        let main = commit("meta-llama/Llama-3.2-1B", "main");
        assert_eq!(main.len(), 40);
        assert_eq!(main, commit("meta-llama/Llama-3.2-1B", "main"));
        assert_ne!(main, commit("meta-llama/Llama-3.2-1B", "v1"));
        assert_eq!(commit("x/y", &main), main, "a commit is its own revision");
        let s = snapshot("x/y", "main");
        assert_eq!(s.files.len(), 4);
        assert_eq!(s.files[2].bytes.len(), 4096);
    }
}
