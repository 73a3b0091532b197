//! An env's specs from the JSON a user writes (`--env-spec`, the Python module's
//! `env_spec=`): at most [`MAX_SPECS_JSON_BYTES`], read strictly ([`crate::strict_json`]:
//! a key given twice is refused naming it), exactly the keys `observation` and `action`,
//! then checked as any specs are ([`EnvSpecs::validate`]), the key at fault named.

use serde_json::Value;

use crate::space::{EnvSpecs, Space, SpaceError};
use crate::strict_json::{value_from_str, StrictJsonError};

/// The most bytes of an env's specs as JSON: 1 MiB, room for per-element bounds of
/// some 40,000 elements (a bigger box takes one bound for all its elements).
pub const MAX_SPECS_JSON_BYTES: usize = 1 << 20;

/// Why JSON is not an env's specs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecsJsonError {
    /// Longer than [`MAX_SPECS_JSON_BYTES`].
    #[error("{len} bytes of JSON, over the limit of {MAX_SPECS_JSON_BYTES} bytes for an env's specs")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Not JSON, or a key given twice (named).
    #[error(transparent)]
    Json(#[from] StrictJsonError),
    /// Not a JSON object.
    #[error("must be an object {{\"observation\": ..., \"action\": ...}}")]
    NotAnObject,
    /// A key other than `observation` and `action`.
    #[error("unknown key `{0}` (keys: observation, action)")]
    UnknownKey(String),
    /// `observation` or `action` is missing.
    #[error("missing `{0}`")]
    Missing(&'static str),
    /// A space that does not read or cannot be collected, naming its batch key.
    #[error(transparent)]
    Space(#[from] SpaceError),
}

impl EnvSpecs {
    /// The specs written as JSON in `text` (PROTOCOL.md §3, Spaces), read strictly and
    /// validated: see the [module](crate::space_json).
    pub fn from_json(text: &str) -> Result<EnvSpecs, SpecsJsonError> {
        if text.len() > MAX_SPECS_JSON_BYTES {
            return Err(SpecsJsonError::TooLong { len: text.len() });
        }
        let Value::Object(mut map) = value_from_str(text)? else {
            return Err(SpecsJsonError::NotAnObject);
        };
        if let Some(other) = map.keys().find(|k| !matches!(k.as_str(), "observation" | "action")) {
            return Err(SpecsJsonError::UnknownKey(other.clone()));
        }
        let mut space = |key: &'static str| -> Result<Space, SpecsJsonError> {
            let v = map.remove(key).ok_or(SpecsJsonError::Missing(key))?;
            serde_json::from_value(v).map_err(|e| {
                SpecsJsonError::Space(SpaceError {
                    key: key.to_string(),
                    reason: e.to_string(),
                })
            })
        };
        let specs = EnvSpecs {
            observation: space("observation")?,
            action: space("action")?,
            agents: None,
        };
        specs.validate()?;
        Ok(specs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACTION: &str = r#""action": {"kind": "discrete", "n": 2}"#;

    #[test]
    fn specs_as_protocol_md_writes_them_read_and_validate() {
        let specs = EnvSpecs::from_json(&format!(
            r#"{{"observation": {{"kind": "dict", "spaces": {{"pixels": {{"kind": "box", "dtype": "u8", "shape": [2, 2], "low": 0, "high": 255}}}}}}, {ACTION}}}"#
        ))
        .unwrap();
        assert_eq!(specs.action, Space::Discrete { n: 2, start: 0 });
    }

    #[test]
    fn a_key_given_twice_is_refused_naming_it_at_the_top_and_inside_a_dict() {
        let e = EnvSpecs::from_json(&format!(
            r#"{{"observation": {{"kind": "discrete", "n": 3}}, {ACTION}, {ACTION}}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("not valid JSON: key `action` given twice"), "{e}");
        let e = EnvSpecs::from_json(&format!(
            r#"{{"observation": {{"kind": "dict", "spaces": {{"a": {{"kind": "discrete", "n": 3}}, "a": {{"kind": "discrete", "n": 4}}}}}}, {ACTION}}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("key `observation.spaces.a` given twice"), "{e}");
        let e = EnvSpecs::from_json(&format!(
            r#"{{"observation": {{"kind": "discrete", "n": 3, "n": 4}}, {ACTION}}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("key `observation.n` given twice"), "{e}");
    }

    #[test]
    fn numbers_beyond_the_specs_limits_are_refused_naming_the_key() {
        let obs = r#""observation": {"kind": "box", "dtype": "f32", "shape": [3]}"#;
        for (action, want) in [
            (r#"{"kind": "discrete", "n": 9223372036854775808}"#, "choices"),
            (r#"{"kind": "discrete", "n": 18446744073709551616}"#, "invalid type"),
            (r#"{"kind": "discrete", "n": 0}"#, "no choice"),
            (r#"{"kind": "discrete", "n": -1}"#, "invalid value"),
            (
                r#"{"kind": "discrete", "n": 2, "start": 9223372036854775807}"#,
                "overflow i64",
            ),
            (r#"{"kind": "discrete", "n": 2.5}"#, "invalid type"),
            (
                r#"{"kind": "multi_discrete", "nvec": [2, 9223372036854775808]}"#,
                "element 1",
            ),
            (r#"{"kind": "multi_binary", "n": 67108865}"#, "multi-binary"),
        ] {
            let e = EnvSpecs::from_json(&format!(r#"{{{obs}, "action": {action}}}"#)).unwrap_err();
            let SpecsJsonError::Space(s) = &e else {
                panic!("{action}: {e}")
            };
            assert_eq!(s.key, "action", "{action}: {e}");
            assert!(s.reason.contains(want), "{action}: `{want}` not in {e}");
        }
        let shape = r#""observation": {"kind": "box", "dtype": "f32", "shape": [4294967296, 4294967296]}"#;
        let e = EnvSpecs::from_json(&format!("{{{shape}, {ACTION}}}"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("observation: a box of shape"), "{e}");
    }

    #[test]
    fn a_discrete_n_beyond_i64_is_refused_in_specs_from_anywhere_by_validate() {
        let specs = |n: u64, start: i64| EnvSpecs {
            observation: Space::Discrete { n: 3, start: 0 },
            action: Space::Discrete { n, start },
            agents: None,
        };
        assert_eq!(specs(i64::MAX as u64, 0).validate(), Ok(()), "the largest n");
        assert_eq!(specs(2, i64::MAX - 1).validate(), Ok(()), "the last start");
        for (n, start) in [(1 << 63, 0), (u64::MAX, i64::MIN), (i64::MAX as u64, 2), (2, i64::MAX)] {
            let e = specs(n, start).validate().unwrap_err();
            assert_eq!(e.key, "action", "{n} from {start}");
            assert_eq!(e.reason, format!("choices {start} + {n} overflow i64"));
        }
    }

    #[test]
    fn other_keys_missing_keys_and_too_long_text_are_refused() {
        let e = EnvSpecs::from_json(r#"{"observation": {"kind": "discrete", "n": 3}}"#).unwrap_err();
        assert_eq!(e, SpecsJsonError::Missing("action"));
        let e = EnvSpecs::from_json(&format!(r#"{{"obs": 1, {ACTION}}}"#)).unwrap_err();
        assert_eq!(e, SpecsJsonError::UnknownKey("obs".into()));
        assert_eq!(EnvSpecs::from_json("[]").unwrap_err(), SpecsJsonError::NotAnObject);
        let long = " ".repeat(MAX_SPECS_JSON_BYTES + 1);
        assert_eq!(
            EnvSpecs::from_json(&long).unwrap_err(),
            SpecsJsonError::TooLong {
                len: MAX_SPECS_JSON_BYTES + 1
            }
        );
    }
}
