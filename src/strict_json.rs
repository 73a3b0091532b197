//! JSON a user writes (an env's specs for `--env-spec` or `env_spec=`), read strictly: a
//! key given twice in one object is refused naming its path (`observation.spaces.pixels`),
//! where `serde_json` would keep the last one silently (into a map or a
//! `serde_json::Value`).
//!
//! The text is read into a [`serde_json::Value`] by a visitor that refuses duplicates,
//! then into the type asked for; the caller bounds the text's length first (the CLI's
//! and the Python module's limit on specs), and `serde_json` bounds the nesting depth.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{DeserializeOwned, DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde_json::{Map, Number, Value};

/// Why strict JSON did not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StrictJsonError {
    /// Not JSON, or a key given twice (the message names its path).
    #[error("not valid JSON: {0}")]
    Syntax(String),
    /// JSON, but not of the type asked for.
    #[error("{0}")]
    Shape(String),
}

/// `text` as a [`Value`], refusing a key given twice in one object.
pub fn value_from_str(text: &str) -> Result<Value, StrictJsonError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Strict { path: String::new() }
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| StrictJsonError::Syntax(e.to_string()))?;
    Ok(value)
}

/// `text` as a `T`, refusing a key given twice in any object of it.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, StrictJsonError> {
    serde_json::from_value(value_from_str(text)?).map_err(|e| StrictJsonError::Shape(e.to_string()))
}

/// Reads one JSON value found at `path` (keys joined by dots, array items as `[i]`).
struct Strict {
    path: String,
}

impl Strict {
    fn child(&self, step: &str) -> Strict {
        let path = if self.path.is_empty() {
            step.to_string()
        } else {
            format!("{}.{step}", self.path)
        };
        Strict { path }
    }
}

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity; a number too large for f64 is refused by the parser.
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("{}: {v} is not a finite number", self.shown())))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(self.child(&format!("[{}]", items.len())))? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut seen = BTreeSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let child = self.child(&key);
            if !seen.insert(key.clone()) {
                return Err(A::Error::custom(format!("key `{}` given twice", child.path)));
            }
            let v = map.next_value_seed(child)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

impl Strict {
    /// The path for a message (`the top level` for the whole document).
    fn shown(&self) -> &str {
        if self.path.is_empty() {
            "the top level"
        } else {
            &self.path
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_given_twice_is_refused_naming_its_path_at_any_depth() {
        let e = value_from_str(r#"{"a": 1, "a": 2}"#).unwrap_err().to_string();
        assert!(e.starts_with("not valid JSON: key `a` given twice"), "{e}");
        let e = value_from_str(r#"{"observation": {"kind": "dict", "spaces": {"x": {}, "y": {}, "x": {}}}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `observation.spaces.x` given twice"), "{e}");
        let e = value_from_str(r#"[{"k": 1}, {"k": 1, "k": 1}]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `[1].k` given twice"), "{e}");
    }

    #[test]
    fn json_without_duplicates_reads_as_serde_json_reads_it() {
        let text = r#"{"a": [1, -2, 3.5, 18446744073709551615, true, null, "s"], "b": {"c": {}}}"#;
        assert_eq!(
            value_from_str(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        let pairs: std::collections::BTreeMap<String, u8> = from_str(r#"{"x": 1, "y": 2}"#).unwrap();
        assert_eq!(pairs.len(), 2);
        let e = from_str::<std::collections::BTreeMap<String, u8>>(r#"{"x": 1, "x": 2}"#).unwrap_err();
        assert!(
            matches!(e, StrictJsonError::Syntax(ref m) if m.contains("key `x` given twice")),
            "{e}"
        );
    }

    #[test]
    fn trailing_text_and_a_type_that_does_not_fit_are_refused() {
        assert!(matches!(value_from_str("{} {}"), Err(StrictJsonError::Syntax(_))));
        assert!(matches!(from_str::<u8>("300"), Err(StrictJsonError::Shape(_))));
    }
}
