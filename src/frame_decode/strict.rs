//! Reading a value straight off the decoder, accepting exactly what serde's buffered
//! decoding of the same value accepts.
//!
//! The frame's own decoding reads a batch's or weight update's fields out of serde's
//! buffer (`Content`: the message types are internally tagged enums), and that buffer
//! answers some requests more strictly than the MessagePack decoder does: a sequence
//! or a struct is never read from a binary blob, an enum only from a string or a map
//! of one key, an identifier only from a string, bytes, or an unsigned integer of one
//! or eight bytes. [`Strict`] wraps the decoder so that the mirror, which reads the
//! same fields without the buffer, refuses what the frame's decoding refuses (the
//! decoder alone would read a blob as a shape, an integer as a dtype). It also goes
//! no further than the buffer: it asks the decoder for nothing the buffer would not
//! have read, so what the decoder refuses is refused alike.
//!
//! Only the answers the mirror's types ask for are strict where the buffer is:
//! integers, floats, bools and values skipped are read as the decoder reads them,
//! which the buffer accepts alike; an enum is only ever a unit variant (a dtype).

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{BorrowedStrDeserializer, StrDeserializer, StringDeserializer};
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, Expected, MapAccess, SeqAccess, Unexpected, VariantAccess, Visitor,
};

/// A deserializer answering as serde's buffer would for the same value.
pub(super) struct Strict<D>(pub(super) D);

/// A seed whose value is read through [`Strict`].
pub(super) struct StrictSeed<S>(pub(super) S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for StrictSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Strict(d))
    }
}

/// What kinds of value one request takes from the buffer.
#[derive(Clone, Copy)]
struct Accept(u8);

impl Accept {
    /// Bools, numbers, chars.
    const SCALAR: u8 = 1;
    /// Strings.
    const STR: u8 = 2;
    /// Binary blobs (and strings that are not UTF-8, which the decoder gives as bytes).
    const BYTES: u8 = 4;
    /// Arrays.
    const SEQ: u8 = 8;
    /// Maps.
    const MAP: u8 = 16;
    /// Nil, and MessagePack extensions (newtype structs).
    const OTHER: u8 = 32;
    /// Anything.
    const ALL: Accept = Accept(63);

    /// Whether a value of `kind` (one of the kinds above) is taken.
    fn takes(self, kind: u8) -> bool {
        self.0 & kind != 0
    }
}

/// `visitor`, taking only the kinds of value `accept` names; anything else is refused
/// as the buffer refuses it (an invalid type).
struct Only<V> {
    visitor: V,
    accept: Accept,
}

impl<V> Only<V> {
    /// `visitor`, taking the kinds in `accept` (a union of [`Accept`]'s kinds).
    fn new(visitor: V, accept: u8) -> Only<V> {
        Only {
            visitor,
            accept: Accept(accept),
        }
    }
}

impl<'de, V: Visitor<'de>> Only<V> {
    /// Checks `kind` is taken, else the buffer's error for `what` (a value of a kind
    /// not taken never reaches the visitor, which might take it).
    fn check<E: de::Error>(&self, kind: u8, what: Unexpected<'_>) -> Result<(), E> {
        if self.accept.takes(kind) {
            Ok(())
        } else {
            Err(E::invalid_type(what, &self.visitor))
        }
    }
}

/// Forwards a scalar visit if scalars are taken.
macro_rules! scalar {
    ($($f:ident($t:ty) => $u:expr;)*) => {$(
        fn $f<E: de::Error>(self, v: $t) -> Result<V::Value, E> {
            self.check(Accept::SCALAR, $u(v))?;
            self.visitor.$f(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Only<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    scalar! {
        visit_bool(bool) => Unexpected::Bool;
        visit_i8(i8) => |v| Unexpected::Signed(i64::from(v));
        visit_i16(i16) => |v| Unexpected::Signed(i64::from(v));
        visit_i32(i32) => |v| Unexpected::Signed(i64::from(v));
        visit_i64(i64) => Unexpected::Signed;
        visit_u8(u8) => |v| Unexpected::Unsigned(u64::from(v));
        visit_u16(u16) => |v| Unexpected::Unsigned(u64::from(v));
        visit_u32(u32) => |v| Unexpected::Unsigned(u64::from(v));
        visit_u64(u64) => Unexpected::Unsigned;
        visit_f32(f32) => |v| Unexpected::Float(f64::from(v));
        visit_f64(f64) => Unexpected::Float;
        visit_char(char) => Unexpected::Char;
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.check(Accept::STR, Unexpected::Str(v))?;
        self.visitor.visit_str(v)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.check(Accept::STR, Unexpected::Str(v))?;
        self.visitor.visit_borrowed_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.check(Accept::STR, Unexpected::Str(&v))?;
        self.visitor.visit_string(v)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<V::Value, E> {
        self.check(Accept::BYTES, Unexpected::Bytes(v))?;
        self.visitor.visit_bytes(v)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<V::Value, E> {
        self.check(Accept::BYTES, Unexpected::Bytes(v))?;
        self.visitor.visit_borrowed_bytes(v)
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<V::Value, E> {
        self.check(Accept::BYTES, Unexpected::Bytes(&v))?;
        self.visitor.visit_byte_buf(v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.check(Accept::OTHER, Unexpected::Unit)?;
        self.visitor.visit_unit()
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.check(Accept::OTHER, Unexpected::Option)?;
        self.visitor.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.check(Accept::OTHER, Unexpected::Option)?;
        self.visitor.visit_some(Strict(d))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.check(Accept::OTHER, Unexpected::NewtypeStruct)?;
        self.visitor.visit_newtype_struct(Strict(d))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.check(Accept::SEQ, Unexpected::Seq)?;
        self.visitor.visit_seq(StrictSeq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.check(Accept::MAP, Unexpected::Map)?;
        self.visitor.visit_map(StrictMap(map))
    }
}

/// An array whose elements are read through [`Strict`].
struct StrictSeq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for StrictSeq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

/// A map whose keys and values are read through [`Strict`].
struct StrictMap<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for StrictMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(StrictSeed(seed))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

/// Forwards requests the buffer answers as the decoder does.
macro_rules! forward {
    ($($f:ident)*) => {$(
        fn $f<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.$f(visitor)
        }
    )*};
}

/// Requests the buffer answers only from some kinds of value.
macro_rules! only {
    ($($f:ident => $accept:expr;)*) => {$(
        fn $f<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.deserialize_any(Only::new(visitor, $accept))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    // A number, bool or char is read from a number, bool or char either way (the
    // decoder refuses anything else, as the value's visitor does from the buffer),
    // and a skipped value is skipped either way.
    forward! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_f32 deserialize_f64 deserialize_char deserialize_ignored_any
        deserialize_i128 deserialize_u128
    }

    only! {
        deserialize_any => Accept::ALL.0;
        deserialize_str => Accept::STR | Accept::BYTES;
        deserialize_string => Accept::STR | Accept::BYTES;
        deserialize_bytes => Accept::STR | Accept::BYTES | Accept::SEQ;
        deserialize_byte_buf => Accept::STR | Accept::BYTES | Accept::SEQ;
        deserialize_seq => Accept::SEQ;
        deserialize_map => Accept::MAP;
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        // The buffer gives nil as unit, which an option takes as `None`; anything
        // else is its value.
        self.0.deserialize_option(Only::new(visitor, Accept::ALL.0))
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(UnitOrEmptyMap(visitor))
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0
            .deserialize_newtype_struct(name, Only::new(visitor, Accept::ALL.0))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, D::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(Only::new(visitor, Accept::SEQ | Accept::MAP))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(Identifier(visitor))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(Enum(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// An identifier, taken as the buffer takes one: a string, bytes, or an unsigned
/// integer the decoder gives as `u8` or `u64` (one of one or eight bytes on the wire).
struct Identifier<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for Identifier<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_u8<E: de::Error>(self, v: u8) -> Result<V::Value, E> {
        self.0.visit_u8(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        self.0.visit_u64(v)
    }

    // Visitors take these as a `u64` unless told otherwise; the buffer does not.
    fn visit_u16<E: de::Error>(self, v: u16) -> Result<V::Value, E> {
        Err(E::invalid_type(Unexpected::Unsigned(u64::from(v)), &self.0))
    }

    fn visit_u32<E: de::Error>(self, v: u32) -> Result<V::Value, E> {
        Err(E::invalid_type(Unexpected::Unsigned(u64::from(v)), &self.0))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.0.visit_str(v)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.0.visit_borrowed_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.0.visit_string(v)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<V::Value, E> {
        self.0.visit_bytes(v)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<V::Value, E> {
        self.0.visit_borrowed_bytes(v)
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<V::Value, E> {
        self.0.visit_byte_buf(v)
    }
}

/// Unit, as the buffer gives it: from nil or an empty map.
struct UnitOrEmptyMap<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for UnitOrEmptyMap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        if map.size_hint() == Some(0) {
            self.0.visit_unit()
        } else {
            Err(de::Error::invalid_type(Unexpected::Map, &self.0))
        }
    }
}

/// An enum, as the buffer takes one: its variant's name as a string, or a map of one
/// key, the variant, to its value.
struct Enum<V>(V);

/// What an enum is read from.
struct StringOrMap;

impl Expected for StringOrMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("string or map")
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Enum<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        StringOrMap.fmt(f)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.0.visit_enum(StrDeserializer::new(v))
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.0.visit_enum(BorrowedStrDeserializer::new(v))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.0.visit_enum(StringDeserializer::new(v))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        if map.size_hint() != Some(1) {
            return Err(de::Error::invalid_value(Unexpected::Map, &"map with a single key"));
        }
        self.0.visit_enum(OneKey(map))
    }
}

/// The map of one key an enum is read from.
struct OneKey<A>(A);

impl<'de, A: MapAccess<'de>> EnumAccess<'de> for OneKey<A> {
    type Error = A::Error;
    type Variant = OneKey<A>;

    fn variant_seed<T: DeserializeSeed<'de>>(mut self, seed: T) -> Result<(T::Value, OneKey<A>), A::Error> {
        match self.0.next_key_seed(StrictSeed(seed))? {
            Some(variant) => Ok((variant, self)),
            None => Err(de::Error::invalid_value(Unexpected::Map, &"map with a single key")),
        }
    }
}

impl<'de, A: MapAccess<'de>> VariantAccess<'de> for OneKey<A> {
    type Error = A::Error;

    fn unit_variant(mut self) -> Result<(), A::Error> {
        self.0.next_value_seed(StrictSeed(PhantomData::<()>))
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(StrictSeed(seed))
    }

    // The mirror's enums (dtypes) have unit variants only.
    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, A::Error> {
        Err(de::Error::custom("tuple variants are not read here"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, A::Error> {
        Err(de::Error::custom("struct variants are not read here"))
    }
}
