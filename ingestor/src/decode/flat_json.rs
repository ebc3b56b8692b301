//! A fast path for the common JSON message: one object whose fields are plain scalars.
//!
//! Going through serde_json's visitors was half of the decoding time of such a message
//! (bench/ingest.py). This scanner reads the top-level object byte by byte into a
//! [`Document`](super::Document)'s slots, and gives up at anything outside the plain case: a
//! string with an escape or a control character, an integer outside 64 bits, `-0`, a
//! projected field holding an object or an array with an escape in it, any syntax error,
//! anything but an object. The caller then parses the message again with serde_json, which
//! stays the one definition of what a message means and of every error message; the scanner
//! only accepts what serde_json accepts, with the same values (a unit test runs both on
//! generated input). Floats are parsed by `core`, correctly rounded, as serde_json's
//! `float_roundtrip` (enabled in the workspace) parses them too.

use std::borrow::Cow;

use serde_json::Value as Json;

use super::document::{Field, Projection};

/// Nesting deeper than this is left to serde_json (whose own limit is 128).
const MAX_DEPTH: usize = 64;

/// Parses `text` into `values` (one empty slot per projected field) if it is a plain object;
/// `false` if the scanner gave up, with `values` in an unspecified state.
pub(super) fn scan_object<'a>(text: &'a str, projection: &Projection, values: &mut [Option<Field<'a>>]) -> bool {
    Scanner { text, bytes: text.as_bytes(), at: 0 }.object(projection, values).is_some()
}

/// A position in the text; every method returns `None` where the scanner gives up.
struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Scanner<'a> {
    fn object(&mut self, projection: &Projection, values: &mut [Option<Field<'a>>]) -> Option<()> {
        self.skip_whitespace();
        self.expect(b'{')?;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
        } else {
            let mut guess = 0;
            loop {
                self.expect(b'"')?;
                let key = self.string_body()?;
                self.skip_whitespace();
                self.expect(b':')?;
                self.skip_whitespace();
                match projection.slot_guessing(key, guess) {
                    Some(slot) => {
                        // A key given twice keeps its last value, as serde_json's map does.
                        values[slot] = self.field()?;
                        guess = slot + 1;
                    }
                    None => self.skip_value(0)?,
                }
                self.skip_whitespace();
                match self.next()? {
                    b',' => self.skip_whitespace(),
                    b'}' => break,
                    _ => return None,
                }
            }
        }
        self.skip_whitespace();
        (self.at == self.bytes.len()).then_some(())
    }

    /// A field's value; `Some(None)` for null.
    fn field(&mut self) -> Option<Option<Field<'a>>> {
        Some(Some(match self.peek()? {
            b'"' => {
                self.at += 1;
                Field::Str(Cow::Borrowed(self.string_body()?))
            }
            b't' => {
                self.literal(b"true")?;
                Field::Bool(true)
            }
            b'f' => {
                self.literal(b"false")?;
                Field::Bool(false)
            }
            b'n' => {
                self.literal(b"null")?;
                return Some(None);
            }
            b'{' | b'[' => {
                // Checked by the skip, then built by serde_json from its exact span.
                let start = self.at;
                self.skip_value(0)?;
                let nested: Json = serde_json::from_str(self.text.get(start..self.at)?).ok()?;
                Field::Nested(Box::new(nested))
            }
            _ => self.number()?,
        }))
    }

    /// Checks one value and moves past it.
    fn skip_value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.at += 1;
                self.string_body().map(drop)
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            open @ (b'{' | b'[') if depth < MAX_DEPTH => {
                let close = if open == b'{' { b'}' } else { b']' };
                self.at += 1;
                self.skip_whitespace();
                if self.peek() == Some(close) {
                    self.at += 1;
                    return Some(());
                }
                loop {
                    if open == b'{' {
                        self.expect(b'"')?;
                        self.string_body()?;
                        self.skip_whitespace();
                        self.expect(b':')?;
                        self.skip_whitespace();
                    }
                    self.skip_value(depth + 1)?;
                    self.skip_whitespace();
                    match self.next()? {
                        b',' => self.skip_whitespace(),
                        b if b == close => return Some(()),
                        _ => return None,
                    }
                }
            }
            _ => self.number().map(drop),
        }
    }

    /// A string's text after its opening quote, up to and past its closing one; gives up at
    /// an escape or a control character.
    fn string_body(&mut self) -> Option<&'a str> {
        let start = self.at;
        let length = string_length(&self.bytes[start..])?;
        self.at = start + length;
        if self.bytes[self.at] != b'"' {
            return None;
        }
        self.at += 1;
        // Both ends are ASCII quotes, so the slice lies on character boundaries.
        self.text.get(start..start + length)
    }

    /// A number in JSON's grammar: a non-negative integer becomes `U64`, a negative one `I64`,
    /// one with a fraction or an exponent `F64`, as serde_json makes them.
    fn number(&mut self) -> Option<Field<'a>> {
        let start = self.at;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let mut magnitude: u64 = 0;
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                while let Some(digit @ b'0'..=b'9') = self.peek() {
                    magnitude = magnitude.checked_mul(10)?.checked_add(u64::from(digit - b'0'))?;
                    self.at += 1;
                }
            }
            _ => return None,
        }
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.digits()?;
            float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.digits()?;
            float = true;
        }
        if float {
            let value: f64 = self.text.get(start..self.at)?.parse().ok()?;
            // serde_json rejects a number out of f64's range.
            return value.is_finite().then_some(Field::F64(value));
        }
        match (negative, magnitude) {
            (false, _) => Some(Field::U64(magnitude)),
            // serde_json makes `-0` a float.
            (true, 0) => None,
            (true, _) => 0i64.checked_sub_unsigned(magnitude).map(Field::I64),
        }
    }

    /// One or more decimal digits.
    fn digits(&mut self) -> Option<()> {
        let count = self.bytes[self.at..].iter().take_while(|b| b.is_ascii_digit()).count();
        self.at += count;
        (count > 0).then_some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let found = self.bytes.get(self.at..self.at + word.len())? == word;
        self.at += word.len();
        found.then_some(())
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }
}

/// The length of a string's text up to its closing quote, a backslash or a control character;
/// `None` if there is none. Eight bytes at a time: the bytes of a string are nearly all plain.
fn string_length(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte that is zero; a false one can only follow a true one, so the
    // lowest is exact.
    let zero_bytes = |w: u64| w.wrapping_sub(ONES) & !w & HIGH;
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        // A byte below 0x20 is one that subtracting 0x20 borrows from, unless it is 0x80 or
        // above.
        let special = zero_bytes(word ^ (ONES * u64::from(b'"')))
            | zero_bytes(word ^ (ONES * u64::from(b'\\')))
            | (word.wrapping_sub(ONES * 0x20) & !word & HIGH);
        if special != 0 {
            return Some(offset + special.trailing_zeros() as usize / 8);
        }
        offset += 8;
    }
    let tail = chunks.remainder().iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    Some(offset + tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn projection() -> Projection {
        Projection::with_names(&["a", "b", "c", "nested"])
    }

    /// The fields as the scanner reads them, or `None` where it gives up.
    fn scanned(text: &str) -> Option<Vec<Option<Field<'_>>>> {
        let p = projection();
        let mut values = vec![None; 4];
        scan_object(text, &p, &mut values).then_some(values)
    }

    /// The fields as serde_json reads them, or `None` for an error.
    fn parsed(text: &str) -> Option<Vec<Option<Field<'_>>>> {
        projection().parse_json_slow(text).ok()
    }

    /// Floats compared bit for bit, so that -0.0 and 0.0 differ.
    fn same(a: &[Option<Field<'_>>], b: &[Option<Field<'_>>]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| match (x, y) {
                (Some(Field::F64(x)), Some(Field::F64(y))) => x.to_bits() == y.to_bits(),
                _ => x == y,
            })
    }

    #[test]
    fn a_string_ends_at_its_first_quote_backslash_or_control_character() {
        let simple = |bytes: &[u8]| bytes.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
        for stop in [b'"', b'\\', 0, 0x1f, b'\n'] {
            for at in 0..20 {
                for filler in [b'a', 0x20, 0x7f, 0x80, 0xff, b'!', b'#', 0x5b, 0x21] {
                    let mut bytes = vec![filler; 24];
                    bytes[at] = stop;
                    bytes[at + 2] = b'"';
                    assert_eq!(string_length(&bytes), simple(&bytes), "{stop:#x} at {at} after {filler:#x}");
                    assert_eq!(string_length(&bytes[..at]), None);
                }
            }
        }
        assert_eq!(string_length("héllo wörld, 東京\"".as_bytes()), Some("héllo wörld, 東京".len()));
    }

    #[test]
    fn plain_objects_are_read_without_serde() {
        let text = r#" { "a" : 1, "skip": {"x": [1, -2.5e3, "s", true, null, {}]}, "b":"two", "c": -3.25 , "a": 7 } "#;
        let values = scanned(text).expect("plain");
        assert_eq!(values[0], Some(Field::U64(7)), "the last of a repeated key");
        assert_eq!(values[1], Some(Field::Str(Cow::Borrowed("two"))));
        assert_eq!(values[2], Some(Field::F64(-3.25)));
        assert_eq!(values[3], None);
        let values = scanned(r#"{"nested": {"x": [1, 2]}, "a": null, "b": false}"#).expect("plain");
        assert_eq!(values[3], Some(Field::Nested(Box::new(serde_json::json!({"x": [1, 2]})))));
        assert_eq!(values[..3], [None, Some(Field::Bool(false)), None]);
    }

    #[test]
    fn what_is_not_plain_is_left_to_serde() {
        for text in [
            r#"{"a": "esc\"aped"}"#,
            r#"{"skip": "esc\naped"}"#,
            "{\"a\": \"tab\tinside\"}",
            r#"{"a": -0}"#,
            r#"{"a": 18446744073709551616}"#,
            r#"{"a": -9223372036854775809}"#,
            r#"{"a": 1e400}"#,
            r#"{"a": 01}"#,
            r#"{"a": 1.}"#,
            r#"{"a": .5}"#,
            r#"{"a": 1,}"#,
            r#"{"a" 1}"#,
            r#"{"a": tru}"#,
            r#"{"a": 1} x"#,
            r#"[1, 2]"#,
            r#""s""#,
            "",
        ] {
            assert!(scanned(text).is_none(), "{text}");
        }
        assert_eq!(scanned(r#"{"a": -9223372036854775808}"#).expect("plain")[0], Some(Field::I64(i64::MIN)));
        assert_eq!(scanned(r#"{"a": 18446744073709551615}"#).expect("plain")[0], Some(Field::U64(u64::MAX)));
    }

    /// Whatever the scanner accepts, serde_json accepts with the same fields; over generated
    /// text that is mostly valid JSON, with faults thrown in.
    #[test]
    fn the_scanner_agrees_with_serde_json() {
        const TOKENS: &[&str] = &[
            "\"a\"",
            "\"b\"",
            "\"c\"",
            "\"nested\"",
            "\"other\"",
            "\"é\"",
            "\"x\\\"y\"",
            "0",
            "7",
            "-12",
            "-0",
            "3.5",
            "-0.0",
            "1e3",
            "2.5E-3",
            "123456789012345678",
            "0.1",
            "1.7976931348623157e308",
            "4.9e-324",
            "9007199254740993",
            "true",
            "false",
            "null",
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            " ",
            "\n",
            "01",
            "1.",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let (mut accepted, mut total) = (0, 0);
        for _ in 0..20_000 {
            // A valid object of scalars and small nested values, then maybe a fault.
            let mut text = String::from("{");
            for field in 0..random(5) {
                if field > 0 {
                    text.push(',');
                }
                text.push_str(TOKENS[random(6)]);
                text.push(':');
                text.push_str(match random(4) {
                    0 => "[1, {\"k\": -2.5}]",
                    1 => "{\"k\": [true, null]}",
                    _ => TOKENS[6 + random(17)],
                });
            }
            text.push('}');
            if random(3) == 0 {
                let at = random(text.len() + 1);
                if text.is_char_boundary(at) {
                    text.insert_str(at, TOKENS[random(TOKENS.len())]);
                }
            }
            total += 1;
            let fast = scanned(&text);
            let slow = parsed(&text);
            if let Some(fast) = fast {
                accepted += 1;
                let slow = slow.unwrap_or_else(|| panic!("serde_json rejects what the scanner took: {text}"));
                assert!(same(&fast, &slow), "{text}: {fast:?} against {slow:?}");
            }
        }
        assert!(accepted > total / 2, "the scanner took only {accepted} of {total}");
    }
}
