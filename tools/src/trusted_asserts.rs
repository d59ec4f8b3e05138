//! Trusted assert verdicts: the part of the `python_tests` tool's judgement that runs outside
//! the sandbox and that the sandboxed code therefore cannot forge.
//!
//! Owns
//! * the splitter ([`split_assert`]): an MBPP-style `assert <expression> == <literal>` becomes
//!   the candidate-side *expression*, which alone is sent into the sandbox, and the *expected*
//!   value, which never is (also `math.isclose(<expression>, <number>, rel_tol=…, abs_tol=…)`,
//!   whose formula is applied here); asserts that cannot be split that way are classified
//!   [`SplitAssert::Untrusted`] with a reason (they still run whole inside the sandbox);
//! * the literal parser ([`parse_literal`]) for Python literal syntax, used both for the expected
//!   values written in test files and for the `repr()`/`ascii()` text the guest reports for the
//!   value of an expression (hostile input: length and nesting limits, no evaluation beyond a
//!   fixed whitelist of builtin constructors applied to literals, evaluated here in Rust);
//! * the values ([`PyValue`], [`PyInt`]) and Python's `==` on them ([`py_eq`], [`compare`],
//!   [`truthy`]), with the cross-type numeric rules of CPython (exact int/float comparison, `nan`
//!   unequal to everything, sets and dicts order-free).
//!
//! It must not depend on the sandbox or the runtime: everything here is pure computation on text
//! and values, so nothing the guest does can reach the verdict except through the one value text
//! it reports, which is parsed like any other hostile input. [`GUEST_LITERAL_PY`] is the
//! guest-side half of that contract (how to turn a value into text this module parses), as
//! Python source for the sandbox harness to embed; this module never runs it.
//!
//! Deliberate differences from running the assert in Python, all towards *failing* a comparison
//! Python would pass: values that are not builtin literals (instances of user classes, numpy
//! scalars and arrays, `Fraction`, `Decimal`, ranges, iterators) have no literal text and so
//! never compare equal; the identity shortcut of Python's container comparison is absent, so a
//! `nan` inside a container is unequal to itself (`[x] == [x]` holds in Python for the same
//! `nan` object `x`, but a reported value and an expected value are never the same object);
//! strings holding lone surrogates are rejected.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt::{self, Write as _};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Longest text, in bytes, that [`parse_literal`] and [`split_assert`] accept. Assumption: a
/// test's expected value or a reported result above 1 MiB is an attack or a bug, not a test.
pub const MAX_TEXT_LEN: usize = 1 << 20;

/// Deepest nesting of brackets, calls and unary operators [`parse_literal`] accepts, and the
/// most redundant parenthesis pairs [`split_assert`] strips. Keeps the recursive parser (and
/// the recursive equality, hashing and formatting of the values it builds) far from the end of
/// a thread's stack on hostile input such as a million `[`.
pub const MAX_DEPTH: usize = 200;

/// Deepest nesting of sets and dicts (displays `{…}` and `set(…)`, `frozenset(…)`, `dict(…)`
/// calls, each counting one level) [`parse_literal`] accepts. Deduplicating a set hashes each
/// element's whole subtree, so the work is bounded by this depth times the text length.
pub const MAX_SET_DEPTH: usize = 32;

/// Most digits of one integer literal: CPython's default `sys.get_int_max_str_digits()`, so the
/// guest's `repr` cannot produce a longer decimal one and the quadratic base conversion of
/// hex/octal/binary literals stays cheap.
pub const MAX_INT_DIGITS: usize = 4300;

/// Guest-side half of the value report, as Python source defining
/// `__switchyard_literal(value) -> str`: the `ascii()` text of `value` rebuilt from builtin types
/// (subclasses of `int`, `float`, `str`, `tuple`, `dict`, … such as `IntEnum`, named tuples,
/// `Counter`, `OrderedDict` and `defaultdict` become their base type, dict key and item views
/// become sets, `bytearray` becomes `bytes`, exactly the conversions under which Python's `==`
/// against a builtin literal is unchanged), or `TypeError` when the value is not a literal (the
/// harness then reports "value is not a literal" and the comparison fails). `ascii()` keeps the
/// report pure ASCII, so printing it cannot fail on encodings. The guest may of course lie; it
/// just cannot know what to lie *to*, since the expected value never enters the sandbox.
pub const GUEST_LITERAL_PY: &str = r#"
def __switchyard_literal(value):
    def canon(v, depth):
        if depth > 150:
            raise TypeError("value nests too deeply")
        t = type(v)
        if v is None or t in (bool, int, float, complex, str, bytes):
            return v
        if isinstance(v, int):
            return int.__int__(v)
        if isinstance(v, float):
            return float.__float__(v)
        if isinstance(v, complex):
            return complex(float.__float__(v.real), float.__float__(v.imag))
        if isinstance(v, str):
            return str.__str__(v)
        if isinstance(v, (bytes, bytearray)):
            return bytes(memoryview(v))
        if isinstance(v, list):
            return [canon(x, depth + 1) for x in list.__iter__(v)]
        if isinstance(v, tuple):
            return tuple(canon(x, depth + 1) for x in tuple.__iter__(v))
        if isinstance(v, frozenset):
            return frozenset(canon(x, depth + 1) for x in frozenset.__iter__(v))
        if isinstance(v, set):
            return set(canon(x, depth + 1) for x in set.__iter__(v))
        if isinstance(v, dict):
            return {canon(k, depth + 1): canon(x, depth + 1) for k, x in dict.items(v)}
        if isinstance(v, (type({}.keys()), type({}.items()))):
            return set(canon(x, depth + 1) for x in v)
        raise TypeError("value of type %s is not a literal" % t.__name__)
    return ascii(canon(value, 0))
"#;

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

/// A Python `int` of any size: an `i128` when it fits, else a normalised decimal string (sign
/// and digits without leading zeros). The representation is canonical, so the derived `==` and
/// `Hash` are exact integer equality and hashing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyInt(IntRepr);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum IntRepr {
    Small(i128),
    /// Invariant: the value lies outside the `i128` range; `digits` has no leading zero.
    Big {
        negative: bool,
        digits: String,
    },
}

impl PyInt {
    /// The integer `value`.
    pub fn from_i128(value: i128) -> Self {
        PyInt(IntRepr::Small(value))
    }

    /// Parses an optionally signed run of decimal digits (leading zeros allowed, no `_`).
    pub fn from_decimal(text: &str) -> Option<Self> {
        let (negative, digits) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self::from_sign_digits(negative, digits))
    }

    /// The value as an `i128`, when it fits.
    pub fn as_i128(&self) -> Option<i128> {
        match self.0 {
            IntRepr::Small(v) => Some(v),
            IntRepr::Big { .. } => None,
        }
    }

    /// Whether the value is zero.
    pub fn is_zero(&self) -> bool {
        matches!(self.0, IntRepr::Small(0))
    }

    /// Python's `float(self)`: correctly rounded; `None` where Python raises `OverflowError`.
    pub fn to_f64(&self) -> Option<f64> {
        let value = match &self.0 {
            IntRepr::Small(v) => *v as f64,
            IntRepr::Big { negative, digits } => {
                let magnitude: f64 = digits.parse().ok()?;
                if *negative { -magnitude } else { magnitude }
            }
        };
        value.is_finite().then_some(value)
    }

    /// The integer equal to `value`, when `value` is finite and integral (exactly, with no
    /// rounding: `2.0**53` gives 9007199254740992).
    pub fn from_integral_f64(value: f64) -> Option<Self> {
        if !value.is_finite() || value.trunc() != value {
            return None;
        }
        const TWO_POW_127: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0;
        if (-TWO_POW_127..TWO_POW_127).contains(&value) {
            // Integral and in range, so the conversion is exact.
            return Some(PyInt(IntRepr::Small(value as i128)));
        }
        // |value| >= 2^127, so it is a normal float: mantissa * 2^shift with shift > 0.
        let bits = value.to_bits();
        let negative = bits >> 63 == 1;
        let exponent = ((bits >> 52) & 0x7ff) as i64;
        let mantissa = (bits & ((1 << 52) - 1)) | (1 << 52);
        let mut shift = exponent - 1075;
        let mut limbs = Limbs::from_u64(mantissa);
        while shift > 0 {
            let step = shift.min(31);
            limbs.mul_add(1u32 << step as u32, 0);
            shift -= step;
        }
        Some(Self::from_sign_digits(negative, &limbs.to_decimal()))
    }

    /// Normalises a sign and decimal digits (leading zeros allowed; empty means zero).
    fn from_sign_digits(negative: bool, digits: &str) -> Self {
        let digits = digits.trim_start_matches('0');
        if digits.is_empty() {
            return PyInt(IntRepr::Small(0));
        }
        if let Ok(magnitude) = digits.parse::<u128>() {
            if !negative && magnitude <= i128::MAX as u128 {
                return PyInt(IntRepr::Small(magnitude as i128));
            }
            if negative && magnitude <= (i128::MAX as u128) + 1 {
                // 2^127 wraps to i128::MIN, which is its own wrapping negation.
                return PyInt(IntRepr::Small((magnitude as i128).wrapping_neg()));
            }
        }
        PyInt(IntRepr::Big { negative, digits: digits.to_string() })
    }

    fn negated(&self) -> Self {
        match &self.0 {
            IntRepr::Small(v) => match v.checked_neg() {
                Some(n) => PyInt(IntRepr::Small(n)),
                None => Self::from_sign_digits(false, &v.unsigned_abs().to_string()),
            },
            IntRepr::Big { negative, digits } => Self::from_sign_digits(!negative, digits),
        }
    }
}

impl fmt::Display for PyInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            IntRepr::Small(v) => write!(f, "{v}"),
            IntRepr::Big { negative, digits } => {
                write!(f, "{}{digits}", if *negative { "-" } else { "" })
            }
        }
    }
}

/// Unsigned big integer in base 10^9, least significant limb first: just enough arithmetic to
/// convert hex/octal/binary literals and huge integral floats to decimal.
#[derive(Default)]
struct Limbs(Vec<u32>);

const LIMB_BASE: u64 = 1_000_000_000;

impl Limbs {
    fn from_u64(mut value: u64) -> Self {
        let mut limbs = Vec::new();
        while value > 0 {
            limbs.push((value % LIMB_BASE) as u32);
            value /= LIMB_BASE;
        }
        Limbs(limbs)
    }

    /// `self = self * mul + add`.
    fn mul_add(&mut self, mul: u32, add: u32) {
        let mut carry = u64::from(add);
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(mul) + carry;
            *limb = (v % LIMB_BASE) as u32;
            carry = v / LIMB_BASE;
        }
        while carry > 0 {
            self.0.push((carry % LIMB_BASE) as u32);
            carry /= LIMB_BASE;
        }
    }

    fn to_decimal(&self) -> String {
        let mut limbs = self.0.iter().rev().skip_while(|&&l| l == 0);
        let Some(first) = limbs.next() else {
            return "0".to_string();
        };
        let mut out = first.to_string();
        for limb in limbs {
            let _ = write!(out, "{limb:09}");
        }
        out
    }
}

/// A value of a Python builtin literal type.
///
/// Containers built by [`parse_literal`] follow Python's rules: set elements are unique under
/// [`py_eq`] (the first of equal elements is kept), dict keys are unique (first key, last
/// value), and set elements and dict keys are hashable (no lists, sets or dicts). Values built
/// by hand need not be; [`py_eq`] compares them as mathematical sets and mappings anyway.
///
/// No `PartialEq`: Python equality is [`py_eq`] (`nan`, cross-type numbers, order-free sets),
/// which a derived structural `==` would silently contradict.
#[derive(Debug, Clone)]
pub enum PyValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// `int`, of any size.
    Int(PyInt),
    /// `float`.
    Float(f64),
    /// `complex`: real and imaginary part.
    Complex(f64, f64),
    /// `str`.
    Str(String),
    /// `bytes`.
    Bytes(Vec<u8>),
    /// `list`.
    List(Vec<PyValue>),
    /// `tuple`.
    Tuple(Vec<PyValue>),
    /// `set`, in insertion order (only [`Display`](fmt::Display) sees the order).
    Set(Vec<PyValue>),
    /// `frozenset`, in insertion order.
    FrozenSet(Vec<PyValue>),
    /// `dict`: key/value pairs in insertion order; keys are compared with [`py_eq`].
    Dict(Vec<(PyValue, PyValue)>),
}

impl PyValue {
    /// An `int` value.
    pub fn int(value: i128) -> Self {
        PyValue::Int(PyInt::from_i128(value))
    }

    /// A `str` value.
    pub fn str(value: impl Into<String>) -> Self {
        PyValue::Str(value.into())
    }

    /// Python's name of the value's type (`int`, `list`, `NoneType`, …).
    pub fn type_name(&self) -> &'static str {
        match self {
            PyValue::None => "NoneType",
            PyValue::Bool(_) => "bool",
            PyValue::Int(_) => "int",
            PyValue::Float(_) => "float",
            PyValue::Complex(..) => "complex",
            PyValue::Str(_) => "str",
            PyValue::Bytes(_) => "bytes",
            PyValue::List(_) => "list",
            PyValue::Tuple(_) => "tuple",
            PyValue::Set(_) => "set",
            PyValue::FrozenSet(_) => "frozenset",
            PyValue::Dict(_) => "dict",
        }
    }
}

/// Python-`repr()` text: exactly CPython's for every value except strings holding non-ASCII
/// characters, where which characters count as printable (kept) or not (escaped) is
/// approximated by a fixed list instead of the Unicode database. Control characters are always
/// escaped, so the text is safe to put in a one-line failure message.
impl fmt::Display for PyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PyValue::None => f.write_str("None"),
            PyValue::Bool(true) => f.write_str("True"),
            PyValue::Bool(false) => f.write_str("False"),
            PyValue::Int(i) => write!(f, "{i}"),
            PyValue::Float(x) => f.write_str(&float_repr(*x, true)),
            PyValue::Complex(re, im) => f.write_str(&complex_repr(*re, *im)),
            PyValue::Str(s) => f.write_str(&str_repr(s)),
            PyValue::Bytes(b) => f.write_str(&bytes_repr(b)),
            PyValue::List(items) => {
                f.write_char('[')?;
                write_items(f, items)?;
                f.write_char(']')
            }
            PyValue::Tuple(items) => {
                f.write_char('(')?;
                write_items(f, items)?;
                if items.len() == 1 {
                    f.write_char(',')?;
                }
                f.write_char(')')
            }
            PyValue::Set(items) if items.is_empty() => f.write_str("set()"),
            PyValue::Set(items) => {
                f.write_char('{')?;
                write_items(f, items)?;
                f.write_char('}')
            }
            PyValue::FrozenSet(items) if items.is_empty() => f.write_str("frozenset()"),
            PyValue::FrozenSet(items) => {
                f.write_str("frozenset({")?;
                write_items(f, items)?;
                f.write_str("})")
            }
            PyValue::Dict(pairs) => {
                f.write_char('{')?;
                for (i, (key, value)) in pairs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{key}: {value}")?;
                }
                f.write_char('}')
            }
        }
    }
}

fn write_items(f: &mut fmt::Formatter<'_>, items: &[PyValue]) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}

/// CPython's `repr(float)` (`add_dot_zero`) or the form used inside `repr(complex)` (no `.0`):
/// shortest round-trip digits, positional for decimal exponents in [-4, 16), else scientific
/// with a signed exponent of at least two digits.
fn float_repr(x: f64, add_dot_zero: bool) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as CPython's repr.
    let sci = format!("{x:e}");
    let Some((mantissa, exponent)) = sci.split_once('e') else {
        return sci;
    };
    let Ok(exponent) = exponent.parse::<i32>() else {
        return sci;
    };
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::from(if negative { "-" } else { "" });
    // Position of the decimal point relative to the digits (0.d1d2… × 10^point).
    let point = exponent + 1;
    if -4 < point && point <= 16 {
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', point.unsigned_abs() as usize));
            out.push_str(&digits);
        } else if point as usize >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point as usize - digits.len()));
            if add_dot_zero {
                out.push_str(".0");
            }
        } else {
            let (int, frac) = digits.split_at(point as usize);
            let _ = write!(out, "{int}.{frac}");
        }
    } else {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        out.push_str(first);
        if !rest.is_empty() {
            let _ = write!(out, ".{rest}");
        }
        let sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exponent.unsigned_abs());
    }
    out
}

/// CPython's `repr(complex)`: `2j` when the real part is +0.0, else `(re±imj)`.
fn complex_repr(re: f64, im: f64) -> String {
    let imag = float_repr(im, false);
    if re == 0.0 && re.is_sign_positive() {
        return format!("{imag}j");
    }
    let sign = if imag.starts_with('-') { "" } else { "+" };
    format!("({}{sign}{imag}j)", float_repr(re, false))
}

/// The quote CPython's repr picks: `'` unless the text holds `'` and no `"`.
fn repr_quote(has_single: bool, has_double: bool) -> char {
    if has_single && !has_double { '"' } else { '\'' }
}

fn str_repr(s: &str) -> String {
    let quote = repr_quote(s.contains('\''), s.contains('"'));
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c < ' ' || c == '\x7f' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_ascii() || is_printable(c) => out.push(c),
            c => {
                let code = c as u32;
                let _ = match code {
                    0..=0xff => write!(out, "\\x{code:02x}"),
                    0x100..=0xffff => write!(out, "\\u{code:04x}"),
                    _ => write!(out, "\\U{code:08x}"),
                };
            }
        }
    }
    out.push(quote);
    out
}

fn bytes_repr(b: &[u8]) -> String {
    let quote = repr_quote(b.contains(&b'\''), b.contains(&b'"')) as u8;
    let mut out = String::with_capacity(b.len() + 3);
    out.push('b');
    out.push(quote as char);
    for &byte in b {
        match byte {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            q if q == quote => {
                out.push('\\');
                out.push(q as char);
            }
            0x20..=0x7e => out.push(byte as char),
            _ => {
                let _ = write!(out, "\\x{byte:02x}");
            }
        }
    }
    out.push(quote as char);
    out
}

/// Approximates `str.isprintable()` for non-ASCII characters: false for the C1 controls, the
/// non-space separators, the common format characters, private use and noncharacters.
fn is_printable(c: char) -> bool {
    !matches!(c as u32,
        0x80..=0xa0
        | 0xad
        | 0x600..=0x605
        | 0x61c
        | 0x6dd
        | 0x70f
        | 0x890..=0x891
        | 0x8e2
        | 0x1680
        | 0x180e
        | 0x2000..=0x200f
        | 0x2028..=0x202f
        | 0x205f..=0x2064
        | 0x2066..=0x206f
        | 0x3000
        | 0xd800..=0xf8ff
        | 0xfdd0..=0xfdef
        | 0xfeff
        | 0xfff0..=0xfffb
        | 0xfffe..=0xffff
        | 0x110bd
        | 0x110cd
        | 0x13430..=0x1343f
        | 0x1bca0..=0x1bca3
        | 0x1d173..=0x1d17a
        | 0x40000..=0xdffff
        | 0xe0000..=0xe00ff
        | 0xe01f0..=0xeffff
        | 0xf0000..=0x10ffff)
        && (c as u32) & 0xfffe != 0xfffe
}

// ---------------------------------------------------------------------------------------------
// Equality
// ---------------------------------------------------------------------------------------------

/// A value seen as a number (bool, int, float or complex).
enum Num<'a> {
    Int(Cow<'a, PyInt>),
    Float(f64),
    Complex(f64, f64),
}

fn as_number(value: &PyValue) -> Option<Num<'_>> {
    Some(match value {
        PyValue::Bool(b) => Num::Int(Cow::Owned(PyInt::from_i128(i128::from(*b)))),
        PyValue::Int(i) => Num::Int(Cow::Borrowed(i)),
        PyValue::Float(x) => Num::Float(*x),
        PyValue::Complex(re, im) => Num::Complex(*re, *im),
        _ => return None,
    })
}

fn num_eq(a: &Num<'_>, b: &Num<'_>) -> bool {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x == y,
        (Num::Int(i), Num::Float(x)) | (Num::Float(x), Num::Int(i)) => {
            PyInt::from_integral_f64(*x).is_some_and(|j| j == **i)
        }
        (Num::Float(x), Num::Float(y)) => x == y,
        (Num::Complex(re, im), other) | (other, Num::Complex(re, im)) => match other {
            Num::Complex(re2, im2) => re == re2 && im == im2,
            real => *im == 0.0 && num_eq(&Num::Float(*re), real),
        },
    }
}

/// Python's `a == b` for builtin values: bool, int, float and complex compare numerically
/// across types (`True == 1 == 1.0 == (1+0j)`, int against float exactly, `nan` unequal to
/// everything including itself); `str` equals only `str` and `bytes` only `bytes`; lists and
/// tuples compare elementwise and a list never equals a tuple; sets and frozensets compare as
/// sets with each other; dicts compare order-free. No identity shortcut (see the module notes).
pub fn py_eq(a: &PyValue, b: &PyValue) -> bool {
    if let (Some(x), Some(y)) = (as_number(a), as_number(b)) {
        return num_eq(&x, &y);
    }
    match (a, b) {
        (PyValue::None, PyValue::None) => true,
        (PyValue::Str(x), PyValue::Str(y)) => x == y,
        (PyValue::Bytes(x), PyValue::Bytes(y)) => x == y,
        (PyValue::List(x), PyValue::List(y)) | (PyValue::Tuple(x), PyValue::Tuple(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        (PyValue::Set(x) | PyValue::FrozenSet(x), PyValue::Set(y) | PyValue::FrozenSet(y)) => set_eq(x, y),
        (PyValue::Dict(x), PyValue::Dict(y)) => dict_eq(x, y),
        _ => false,
    }
}

/// Python's `bool(value)`.
pub fn truthy(value: &PyValue) -> bool {
    match value {
        PyValue::None => false,
        PyValue::Bool(b) => *b,
        PyValue::Int(i) => !i.is_zero(),
        PyValue::Float(x) => *x != 0.0,
        PyValue::Complex(re, im) => *re != 0.0 || *im != 0.0,
        PyValue::Str(s) => !s.is_empty(),
        PyValue::Bytes(b) => !b.is_empty(),
        PyValue::List(items) | PyValue::Tuple(items) | PyValue::Set(items) | PyValue::FrozenSet(items) => {
            !items.is_empty()
        }
        PyValue::Dict(pairs) => !pairs.is_empty(),
    }
}

/// Distinguishes the hashes of `nan`s, which equal nothing, so that many of them in one set
/// cannot pile up in one bucket.
static NAN_SALT: AtomicU64 = AtomicU64::new(0);

/// A hash consistent with [`py_eq`] (equal values hash alike), or the name of the unhashable
/// type found (list, set, dict; also inside a tuple or frozenset).
fn hash_value(state: &RandomState, value: &PyValue) -> Result<u64, &'static str> {
    let mut h = state.build_hasher();
    match value {
        PyValue::None => 0u8.hash(&mut h),
        PyValue::Str(s) => (4u8, s).hash(&mut h),
        PyValue::Bytes(b) => (5u8, b).hash(&mut h),
        PyValue::Tuple(items) => {
            (6u8, items.len()).hash(&mut h);
            for item in items {
                hash_value(state, item)?.hash(&mut h);
            }
        }
        PyValue::FrozenSet(items) => {
            let mut hashes =
                items.iter().map(|item| hash_value(state, item)).collect::<Result<Vec<_>, _>>()?;
            // Order-free, and duplicates (possible in hand-built values) do not count.
            hashes.sort_unstable();
            hashes.dedup();
            (7u8, hashes).hash(&mut h);
        }
        PyValue::List(_) | PyValue::Set(_) | PyValue::Dict(_) => return Err(value.type_name()),
        number => match as_number(number) {
            Some(Num::Int(i)) => (1u8, &*i).hash(&mut h),
            Some(Num::Float(x)) => hash_real(x, &mut h),
            Some(Num::Complex(re, im)) => {
                if im == 0.0 {
                    // Equal to the real number `re`.
                    hash_real(re, &mut h);
                } else if re.is_nan() || im.is_nan() {
                    (9u8, NAN_SALT.fetch_add(1, Ordering::Relaxed)).hash(&mut h);
                } else {
                    let re = if re == 0.0 { 0.0 } else { re };
                    (3u8, re.to_bits(), im.to_bits()).hash(&mut h);
                }
            }
            None => return Err(number.type_name()),
        },
    }
    Ok(h.finish())
}

fn hash_real(x: f64, h: &mut impl Hasher) {
    if x.is_nan() {
        (9u8, NAN_SALT.fetch_add(1, Ordering::Relaxed)).hash(h);
    } else if let Some(i) = PyInt::from_integral_f64(x) {
        // Integral floats hash like the equal int (this also folds -0.0 into 0).
        (1u8, i).hash(h);
    } else {
        (2u8, x.to_bits()).hash(h);
    }
}

/// The distinct keys of a set or dict under [`py_eq`], hashed, for order-free lookups in linear
/// time.
struct Index<'a> {
    state: RandomState,
    /// Distinct keys, first occurrence kept.
    keys: Vec<&'a PyValue>,
    /// `hash_value` of each key (`None`: unhashable, possible only in hand-built values).
    hashes: Vec<Option<u64>>,
    buckets: HashMap<u64, Vec<usize>>,
    /// Positions of the unhashable keys: searched linearly.
    unhashable: Vec<usize>,
}

impl<'a> Index<'a> {
    /// An empty index hashing with `state` (indexes to be compared share one, so that the
    /// hashes of one side serve lookups in the other).
    fn new(state: RandomState) -> Self {
        Index { state, keys: Vec::new(), hashes: Vec::new(), buckets: HashMap::new(), unhashable: Vec::new() }
    }

    /// Position of the key equal to `key`, adding it first when there is none.
    fn insert(&mut self, key: &'a PyValue) -> usize {
        let hash = hash_value(&self.state, key).ok();
        if let Some(i) = self.find_hashed(hash, key) {
            return i;
        }
        let i = self.keys.len();
        self.keys.push(key);
        self.hashes.push(hash);
        match hash {
            Some(h) => self.buckets.entry(h).or_default().push(i),
            None => self.unhashable.push(i),
        }
        i
    }

    /// Position of a key equal to `needle`, whose `hash_value` is `hash`.
    fn find_hashed(&self, hash: Option<u64>, needle: &PyValue) -> Option<usize> {
        let equal = |i: &usize| py_eq(self.keys[*i], needle);
        match hash {
            Some(h) => self
                .buckets
                .get(&h)
                .and_then(|bucket| bucket.iter().copied().find(|i| equal(i)))
                // A hand-built `Set` key can equal a hashable `FrozenSet` needle.
                .or_else(|| self.unhashable.iter().copied().find(|i| equal(i))),
            None => (0..self.keys.len()).find(|i| equal(i)),
        }
    }

    /// The distinct keys with their hashes.
    fn entries(&self) -> impl Iterator<Item = (usize, Option<u64>, &'a PyValue)> + '_ {
        self.keys.iter().zip(&self.hashes).enumerate().map(|(i, (key, hash))| (i, *hash, *key))
    }
}

/// Set equality: the same number of distinct elements, and each of one side's in the other.
/// (One direction suffices: distinct elements cannot match the same element of the other side.
/// Checking both directions would compare nested sets twice per level, exponential in depth.)
fn set_eq(x: &[PyValue], y: &[PyValue]) -> bool {
    let state = RandomState::new();
    let (mut ix, mut iy) = (Index::new(state.clone()), Index::new(state));
    for key in x {
        ix.insert(key);
    }
    for key in y {
        iy.insert(key);
    }
    ix.keys.len() == iy.keys.len() && ix.entries().all(|(_, hash, key)| iy.find_hashed(hash, key).is_some())
}

/// Dict equality: the same distinct keys (the last value of a repeated key wins, as in a dict
/// display), and equal values under equal keys.
fn dict_eq(a: &[(PyValue, PyValue)], b: &[(PyValue, PyValue)]) -> bool {
    fn index(pairs: &[(PyValue, PyValue)], state: RandomState) -> (Index<'_>, Vec<&PyValue>) {
        let mut index = Index::new(state);
        let mut values = Vec::new();
        for (key, value) in pairs {
            let i = index.insert(key);
            if i < values.len() {
                values[i] = value;
            } else {
                values.push(value);
            }
        }
        (index, values)
    }
    let state = RandomState::new();
    let ((ia, va), (ib, vb)) = (index(a, state.clone()), index(b, state));
    ia.keys.len() == ib.keys.len()
        && ia.entries().all(|(i, hash, key)| ib.find_hashed(hash, key).is_some_and(|j| py_eq(va[i], vb[j])))
}

/// Keys kept unique under [`py_eq`] in first-insertion order, as Python's set and dict do.
struct UniqueKeys {
    state: RandomState,
    buckets: HashMap<u64, Vec<usize>>,
    keys: Vec<PyValue>,
}

impl UniqueKeys {
    fn new() -> Self {
        UniqueKeys { state: RandomState::new(), buckets: HashMap::new(), keys: Vec::new() }
    }

    /// Position of the key equal to `key`, inserting it first when new; `Err` names the
    /// unhashable type.
    fn insert(&mut self, key: PyValue) -> Result<usize, String> {
        let h =
            hash_value(&self.state, &key).map_err(|type_name| format!("unhashable type: '{type_name}'"))?;
        let bucket = self.buckets.entry(h).or_default();
        if let Some(&i) = bucket.iter().find(|&&i| py_eq(&self.keys[i], &key)) {
            return Ok(i);
        }
        bucket.push(self.keys.len());
        self.keys.push(key);
        Ok(self.keys.len() - 1)
    }
}

struct DictBuilder {
    keys: UniqueKeys,
    values: Vec<PyValue>,
}

impl DictBuilder {
    fn new() -> Self {
        DictBuilder { keys: UniqueKeys::new(), values: Vec::new() }
    }

    /// Python's `d[key] = value`: an equal existing key stays, its value is replaced.
    fn insert(&mut self, key: PyValue, value: PyValue) -> Result<(), String> {
        let i = self.keys.insert(key)?;
        if i < self.values.len() {
            self.values[i] = value;
        } else {
            self.values.push(value);
        }
        Ok(())
    }

    fn finish(self) -> Vec<(PyValue, PyValue)> {
        self.keys.keys.into_iter().zip(self.values).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Literal parser
// ---------------------------------------------------------------------------------------------

/// Why a text is not a trusted literal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiteralError {
    /// Longer than [`MAX_TEXT_LEN`].
    #[error("literal is {len} bytes long; the limit is {limit}")]
    TooLong {
        /// Length of the text, in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Nested deeper than [`MAX_DEPTH`], or sets and dicts deeper than [`MAX_SET_DEPTH`].
    #[error("literal nests deeper than {limit} levels")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// Not valid Python literal syntax.
    #[error("syntax error at byte {offset}: {message}")]
    Syntax {
        /// Byte offset in the text.
        offset: usize,
        /// What is wrong.
        message: String,
    },
    /// Valid Python, but not a literal: a name, an operator, a call outside the whitelist.
    #[error("not a literal at byte {offset}: {message}")]
    NotLiteral {
        /// Byte offset in the text.
        offset: usize,
        /// What is there.
        message: String,
    },
    /// A literal this parser declines: `\N{…}` escapes, lone surrogates, integers longer than
    /// [`MAX_INT_DIGITS`] digits.
    #[error("unsupported literal at byte {offset}: {message}")]
    Unsupported {
        /// Byte offset in the text.
        offset: usize,
        /// What is unsupported.
        message: String,
    },
    /// Python would raise evaluating it (`{[1]}`: unhashable; `dict([1])`; `int('x')`).
    #[error("invalid value at byte {offset}: {message}")]
    Invalid {
        /// Byte offset in the text.
        offset: usize,
        /// Python's complaint.
        message: String,
    },
}

/// Which spellings of `inf` and `nan` count as literals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `repr()` output: bare `inf`, `nan`, `infj`, `nanj` are the float/complex values.
    Repr,
    /// Test-file source: those are names (whose meaning depends on imports), so not literals.
    Source,
}

/// Python's reserved words, which cannot name a keyword argument.
const PY_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def",
    "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is",
    "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

/// Builtins evaluated in Rust when all their arguments are literals.
const CONSTRUCTORS: &[&str] = &["set", "frozenset", "tuple", "list", "dict", "float", "int", "str", "bool"];

/// Parses Python literal syntax into a value: the `repr()` (or `ascii()`) text of builtin values
/// and expected values as written in test files.
///
/// Accepted: `None`, `True`, `False`; ints (`_` separators, `0x`/`0o`/`0b`, any size up to
/// [`MAX_INT_DIGITS`] digits); floats (`1.5`, `1e-3`, `.5`, `5.`, and the repr forms `inf`,
/// `nan`); imaginary literals (`2j`) and the sums `1+2j`, `(-0-3.5j)`, `(inf+nanj)`; unary `-`
/// and `+` on numbers; strings and bytes with any quotes, the prefixes `r`, `u`, `b`, `rb`,
/// `br` in any case, every escape except `\N{…}`, and implicit concatenation; tuples (`()`,
/// `(1,)`), lists, dicts and sets with trailing commas; and calls of the builtin constructors
/// `set`, `frozenset`, `tuple`, `list`, `dict` (an iterable of pairs and/or keywords), `float`,
/// `int`, `str` (of a scalar) and `bool` whose arguments are literals, evaluated here with
/// Python's semantics (`set('ab')` is `{'a', 'b'}`, `float('inf')` is infinity). Whitespace
/// and comments may appear between tokens, line breaks only inside brackets or around the
/// literal (as in Python's `eval`).
///
/// Everything else is an error: names, attribute access, other calls, arithmetic other than
/// forming a complex number, comprehensions, f-strings, a bare top-level tuple `1, 2`. Texts
/// over [`MAX_TEXT_LEN`] bytes or nesting deeper than [`MAX_DEPTH`] are refused before any
/// deep recursion, so hostile input cannot overflow the stack.
pub fn parse_literal(text: &str) -> Result<PyValue, LiteralError> {
    parse_with(text, Mode::Repr)
}

fn parse_with(text: &str, mode: Mode) -> Result<PyValue, LiteralError> {
    if text.len() > MAX_TEXT_LEN {
        return Err(LiteralError::TooLong { len: text.len(), limit: MAX_TEXT_LEN });
    }
    let mut parser = Parser { src: text, pos: 0, mode, brackets: 0, sets: 0 };
    parser.skip_blank_lines();
    let value = parser.parse_expr(0)?;
    parser.skip_blank_lines();
    if parser.pos < text.len() {
        return parser.syntax("unexpected text after the literal");
    }
    Ok(value)
}

/// A string literal's prefix, decoded.
#[derive(Debug, Clone, Copy)]
struct StrKind {
    raw: bool,
    bytes: bool,
    format: bool,
}

fn string_prefix(prefix: &str) -> Option<StrKind> {
    let (raw, bytes, format) = match prefix.to_ascii_lowercase().as_str() {
        "" | "u" => (false, false, false),
        "r" => (true, false, false),
        "b" => (false, true, false),
        "br" | "rb" => (true, true, false),
        "f" => (false, false, true),
        "fr" | "rf" => (true, false, true),
        _ => return None,
    };
    Some(StrKind { raw, bytes, format })
}

/// The decoded content of a string or bytes literal being built.
enum StrOut {
    Str(String),
    Bytes(Vec<u8>),
}

impl StrOut {
    fn push_char(&mut self, c: char, offset: usize) -> Result<(), LiteralError> {
        match self {
            StrOut::Str(s) => s.push(c),
            StrOut::Bytes(b) if c.is_ascii() => b.push(c as u8),
            StrOut::Bytes(_) => {
                return Err(LiteralError::Syntax {
                    offset,
                    message: "bytes can only contain ASCII literal characters".into(),
                });
            }
        }
        Ok(())
    }

    /// Appends the character or byte with this code, from an escape sequence.
    fn push_code(&mut self, code: u32, offset: usize) -> Result<(), LiteralError> {
        let unsupported = |message: &str| LiteralError::Unsupported { offset, message: message.into() };
        match self {
            StrOut::Str(s) => s.push(
                char::from_u32(code)
                    .ok_or_else(|| unsupported("lone surrogate or code point out of range"))?,
            ),
            StrOut::Bytes(b) => {
                b.push(u8::try_from(code).map_err(|_| unsupported("octal escape out of range in bytes"))?)
            }
        }
        Ok(())
    }
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    mode: Mode,
    /// Open brackets around the position: line breaks are whitespace only inside brackets.
    brackets: usize,
    /// Open sets and dicts (displays and constructor calls) around the position.
    sets: usize,
}

/// A decimal number's text (digits, `.`, exponent; `_` removed; no `j`).
struct DecimalToken {
    text: String,
    float: bool,
    imag: bool,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<u8> {
        self.src.as_bytes().get(self.pos + ahead).copied()
    }

    fn next_char(&self) -> Option<char> {
        self.src.get(self.pos..).and_then(|rest| rest.chars().next())
    }

    fn eat(&mut self, byte: u8) -> bool {
        let hit = self.peek() == Some(byte);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn expect(&mut self, byte: u8, what: &str) -> Result<(), LiteralError> {
        if self.eat(byte) { Ok(()) } else { self.syntax(format!("expected {what}")) }
    }

    fn syntax<T>(&self, message: impl Into<String>) -> Result<T, LiteralError> {
        Err(LiteralError::Syntax { offset: self.pos, message: message.into() })
    }

    fn deeper(&self, depth: usize) -> Result<usize, LiteralError> {
        if depth >= MAX_DEPTH { Err(LiteralError::TooDeep { limit: MAX_DEPTH }) } else { Ok(depth + 1) }
    }

    /// Skips whitespace (line breaks only inside brackets, as in Python), comments and line
    /// continuations.
    fn skip_ws(&mut self) {
        self.skip_space(self.brackets > 0);
    }

    /// Skips whitespace, line breaks included, and comments (before and after the literal).
    fn skip_blank_lines(&mut self) {
        self.skip_space(true);
    }

    fn skip_space(&mut self, line_breaks: bool) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' | 0x0c => self.pos += 1,
                b'\n' | b'\r' if line_breaks => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(), None | Some(b'\n' | b'\r')) {
                        self.pos += 1;
                    }
                }
                b'\\' if matches!(self.peek_at(1), Some(b'\n' | b'\r')) => self.pos += 2,
                _ => break,
            }
        }
    }

    fn read_name(&mut self) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            self.pos += 1;
        }
        &self.src[start..self.pos]
    }

    /// A value, or the sum/difference of a real number and an imaginary one (`1+2j`).
    fn parse_expr(&mut self, depth: usize) -> Result<PyValue, LiteralError> {
        let value = self.parse_unary(depth)?;
        self.skip_ws();
        let Some(op @ (b'+' | b'-')) = self.peek() else {
            return Ok(value);
        };
        let op_at = self.pos;
        let not_literal = |message: &str| LiteralError::NotLiteral { offset: op_at, message: message.into() };
        let real = match &value {
            PyValue::Int(i) => i.to_f64().ok_or_else(|| LiteralError::Invalid {
                offset: op_at,
                message: "int too large to convert to float".into(),
            })?,
            PyValue::Float(x) => *x,
            _ => return Err(not_literal("arithmetic is allowed only to form a complex number")),
        };
        self.pos += 1;
        let PyValue::Complex(re, im) = self.parse_atom(self.deeper(depth)?)? else {
            return Err(not_literal("arithmetic is allowed only to form a complex number"));
        };
        // Python: complex(real, 0.0) ± complex(re, im), component by component.
        let value = if op == b'+' {
            PyValue::Complex(real + re, 0.0 + im)
        } else {
            PyValue::Complex(real - re, 0.0 - im)
        };
        self.skip_ws();
        if matches!(self.peek(), Some(b'+' | b'-')) {
            return Err(LiteralError::NotLiteral {
                offset: self.pos,
                message: "arithmetic is allowed only to form a complex number".into(),
            });
        }
        Ok(value)
    }

    fn parse_unary(&mut self, depth: usize) -> Result<PyValue, LiteralError> {
        self.skip_ws();
        let Some(op @ (b'+' | b'-')) = self.peek() else {
            return self.parse_atom(depth);
        };
        let at = self.pos;
        self.pos += 1;
        let operand = self.parse_unary(self.deeper(depth)?)?;
        let negate = op == b'-';
        Ok(match operand {
            PyValue::Bool(b) => {
                let v = i128::from(b);
                PyValue::int(if negate { -v } else { v })
            }
            PyValue::Int(i) => PyValue::Int(if negate { i.negated() } else { i }),
            PyValue::Float(x) => PyValue::Float(if negate { -x } else { x }),
            PyValue::Complex(re, im) if negate => PyValue::Complex(-re, -im),
            c @ PyValue::Complex(..) => c,
            other => {
                return Err(LiteralError::NotLiteral {
                    offset: at,
                    message: format!("unary `{}` on a {}", op as char, other.type_name()),
                });
            }
        })
    }

    fn parse_atom(&mut self, depth: usize) -> Result<PyValue, LiteralError> {
        self.skip_ws();
        let start = self.pos;
        let Some(b) = self.peek() else {
            return self.syntax("unexpected end of text");
        };
        match b {
            b'(' => self.bracketed(|p| p.parse_paren(depth)),
            b'[' => self.bracketed(|p| {
                p.pos += 1;
                let d = p.deeper(depth)?;
                Ok(PyValue::List(p.parse_items(b']', d)?))
            }),
            b'{' => self.set_level(|p| p.bracketed(|p| p.parse_brace(depth))),
            b'\'' | b'"' => self.parse_strings(),
            b'0'..=b'9' => self.parse_number(),
            b'.' if matches!(self.peek_at(1), Some(b'0'..=b'9')) => self.parse_number(),
            b if b.is_ascii_alphabetic() || b == b'_' => {
                let name = self.read_name();
                if matches!(self.peek(), Some(b'\'' | b'"')) && string_prefix(name).is_some() {
                    self.pos = start;
                    return self.parse_strings();
                }
                self.parse_name(name, start, depth)
            }
            _ => Err(LiteralError::NotLiteral {
                offset: start,
                message: format!("unexpected {:?}", self.next_char().unwrap_or('?')),
            }),
        }
    }

    fn parse_name(&mut self, name: &str, start: usize, depth: usize) -> Result<PyValue, LiteralError> {
        match name {
            "True" => return Ok(PyValue::Bool(true)),
            "False" => return Ok(PyValue::Bool(false)),
            "None" => return Ok(PyValue::None),
            "inf" if self.mode == Mode::Repr => return Ok(PyValue::Float(f64::INFINITY)),
            "nan" if self.mode == Mode::Repr => return Ok(PyValue::Float(f64::NAN)),
            "infj" if self.mode == Mode::Repr => return Ok(PyValue::Complex(0.0, f64::INFINITY)),
            "nanj" if self.mode == Mode::Repr => return Ok(PyValue::Complex(0.0, f64::NAN)),
            _ => {}
        }
        let after = self.pos;
        self.skip_ws();
        if self.peek() == Some(b'(') {
            if matches!(name, "set" | "frozenset" | "dict") {
                return self.set_level(|p| p.bracketed(|p| p.parse_call(name, start, depth)));
            }
            return self.bracketed(|p| p.parse_call(name, start, depth));
        }
        self.pos = after;
        Err(LiteralError::NotLiteral { offset: start, message: format!("name `{name}` is not a literal") })
    }

    /// Runs `parse` (which consumes a bracketed construct) with line breaks as whitespace.
    fn bracketed<T>(
        &mut self,
        parse: impl FnOnce(&mut Self) -> Result<T, LiteralError>,
    ) -> Result<T, LiteralError> {
        self.brackets += 1;
        let result = parse(self);
        self.brackets -= 1;
        result
    }

    /// Runs `parse` (which builds a set or dict) one set level deeper, within [`MAX_SET_DEPTH`].
    fn set_level<T>(
        &mut self,
        parse: impl FnOnce(&mut Self) -> Result<T, LiteralError>,
    ) -> Result<T, LiteralError> {
        if self.sets >= MAX_SET_DEPTH {
            return Err(LiteralError::TooDeep { limit: MAX_SET_DEPTH });
        }
        self.sets += 1;
        let result = parse(self);
        self.sets -= 1;
        result
    }

    /// `(…)`: the empty tuple, a parenthesised value, or a tuple.
    fn parse_paren(&mut self, depth: usize) -> Result<PyValue, LiteralError> {
        self.pos += 1;
        let d = self.deeper(depth)?;
        self.skip_ws();
        if self.eat(b')') {
            return Ok(PyValue::Tuple(Vec::new()));
        }
        let first = self.parse_expr(d)?;
        self.skip_ws();
        if self.eat(b')') {
            return Ok(first);
        }
        self.expect(b',', "`,` or `)`")?;
        let mut items = vec![first];
        items.extend(self.parse_items(b')', d)?);
        Ok(PyValue::Tuple(items))
    }

    /// Comma-separated values up to `close` (a trailing comma allowed).
    fn parse_items(&mut self, close: u8, depth: usize) -> Result<Vec<PyValue>, LiteralError> {
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(close) {
                return Ok(items);
            }
            items.push(self.parse_expr(depth)?);
            self.skip_ws();
            if self.eat(close) {
                return Ok(items);
            }
            self.expect(b',', &format!("`,` or `{}`", close as char))?;
        }
    }

    /// `{…}`: a dict or a set.
    fn parse_brace(&mut self, depth: usize) -> Result<PyValue, LiteralError> {
        self.pos += 1;
        let d = self.deeper(depth)?;
        self.skip_ws();
        if self.eat(b'}') {
            return Ok(PyValue::Dict(Vec::new()));
        }
        let invalid = |offset: usize| move |message: String| LiteralError::Invalid { offset, message };
        let first_at = self.pos;
        let first = self.parse_expr(d)?;
        self.skip_ws();
        if self.eat(b':') {
            let mut dict = DictBuilder::new();
            let value = self.parse_expr(d)?;
            dict.insert(first, value).map_err(invalid(first_at))?;
            while self.more_items(b'}')? {
                let key_at = self.pos;
                let key = self.parse_expr(d)?;
                self.skip_ws();
                self.expect(b':', "`:`")?;
                let value = self.parse_expr(d)?;
                dict.insert(key, value).map_err(invalid(key_at))?;
            }
            Ok(PyValue::Dict(dict.finish()))
        } else {
            let mut set = UniqueKeys::new();
            set.insert(first).map_err(invalid(first_at))?;
            while self.more_items(b'}')? {
                let item_at = self.pos;
                let item = self.parse_expr(d)?;
                set.insert(item).map_err(invalid(item_at))?;
            }
            Ok(PyValue::Set(set.keys))
        }
    }

    /// After an item: whether another follows (consuming the `,`), or `close` ended the list.
    fn more_items(&mut self, close: u8) -> Result<bool, LiteralError> {
        self.skip_ws();
        if self.eat(close) {
            return Ok(false);
        }
        self.expect(b',', &format!("`,` or `{}`", close as char))?;
        self.skip_ws();
        Ok(!self.eat(close))
    }

    /// Whether a string literal (with an optional prefix) starts here.
    fn at_string_start(&self) -> bool {
        let rest = &self.src.as_bytes()[self.pos..];
        let prefix_len = rest.iter().take_while(|b| b.is_ascii_alphabetic()).count();
        prefix_len <= 2
            && matches!(rest.get(prefix_len), Some(b'\'' | b'"'))
            && string_prefix(&self.src[self.pos..self.pos + prefix_len]).is_some()
    }

    /// One or more adjacent string literals, concatenated.
    fn parse_strings(&mut self) -> Result<PyValue, LiteralError> {
        let mut acc: Option<StrOut> = None;
        loop {
            let at = self.pos;
            let piece = self.parse_one_string()?;
            acc = Some(match (acc, piece) {
                (None, piece) => piece,
                (Some(StrOut::Str(mut a)), StrOut::Str(b)) => {
                    a.push_str(&b);
                    StrOut::Str(a)
                }
                (Some(StrOut::Bytes(mut a)), StrOut::Bytes(b)) => {
                    a.extend(b);
                    StrOut::Bytes(a)
                }
                _ => {
                    return Err(LiteralError::Syntax {
                        offset: at,
                        message: "cannot mix bytes and nonbytes literals".into(),
                    });
                }
            });
            let before = self.pos;
            self.skip_ws();
            if !self.at_string_start() {
                self.pos = before;
                break;
            }
        }
        Ok(match acc {
            Some(StrOut::Bytes(b)) => PyValue::Bytes(b),
            Some(StrOut::Str(s)) => PyValue::Str(s),
            None => PyValue::Str(String::new()),
        })
    }

    fn parse_one_string(&mut self) -> Result<StrOut, LiteralError> {
        let start = self.pos;
        let prefix = self.read_name();
        let Some(kind) = string_prefix(prefix) else {
            return Err(LiteralError::Syntax {
                offset: start,
                message: format!("invalid string prefix `{prefix}`"),
            });
        };
        if kind.format {
            return Err(LiteralError::NotLiteral {
                offset: start,
                message: "f-strings are not literals".into(),
            });
        }
        let Some(quote @ (b'\'' | b'"')) = self.peek() else {
            return self.syntax("expected a quote");
        };
        let triple = self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote);
        self.pos += if triple { 3 } else { 1 };
        let unterminated =
            || LiteralError::Syntax { offset: start, message: "unterminated string literal".into() };
        let mut out = if kind.bytes { StrOut::Bytes(Vec::new()) } else { StrOut::Str(String::new()) };
        loop {
            let at = self.pos;
            let c = self.next_char().ok_or_else(unterminated)?;
            if c == quote as char {
                if !triple {
                    self.pos += 1;
                    break;
                }
                if self.src.as_bytes()[self.pos..].starts_with(&[quote; 3]) {
                    self.pos += 3;
                    break;
                }
            }
            if !triple && (c == '\n' || c == '\r') {
                return Err(unterminated());
            }
            self.pos += c.len_utf8();
            if c != '\\' {
                out.push_char(c, at)?;
            } else if kind.raw {
                // A raw string keeps the backslash and the character after it (which cannot
                // end the literal).
                out.push_char('\\', at)?;
                let next = self.next_char().ok_or_else(unterminated)?;
                self.pos += next.len_utf8();
                out.push_char(next, at)?;
            } else {
                self.parse_escape(kind.bytes, &mut out, at)?;
            }
        }
        Ok(out)
    }

    /// An escape sequence, after its backslash (at byte `at`).
    fn parse_escape(&mut self, bytes: bool, out: &mut StrOut, at: usize) -> Result<(), LiteralError> {
        let c = self.next_char().ok_or_else(|| LiteralError::Syntax {
            offset: at,
            message: "unterminated string literal".into(),
        })?;
        self.pos += c.len_utf8();
        let code = match c {
            '\n' => return Ok(()),
            '\r' => {
                self.eat(b'\n');
                return Ok(());
            }
            '\\' | '\'' | '"' => c as u32,
            'a' => 0x07,
            'b' => 0x08,
            'f' => 0x0c,
            'n' => 0x0a,
            'r' => 0x0d,
            't' => 0x09,
            'v' => 0x0b,
            '0'..='7' => {
                let mut value = c as u32 - '0' as u32;
                for _ in 0..2 {
                    match self.peek() {
                        Some(d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            self.pos += 1;
                        }
                        _ => break,
                    }
                }
                value
            }
            'x' => self.hex_escape(2, at)?,
            'u' if !bytes => self.hex_escape(4, at)?,
            'U' if !bytes => self.hex_escape(8, at)?,
            'N' if !bytes => {
                return Err(LiteralError::Unsupported {
                    offset: at,
                    message: "\\N{...} escapes are not supported".into(),
                });
            }
            other => {
                // Unknown escapes keep their backslash, as in Python.
                out.push_char('\\', at)?;
                return out.push_char(other, at);
            }
        };
        out.push_code(code, at)
    }

    fn hex_escape(&mut self, digits: usize, at: usize) -> Result<u32, LiteralError> {
        let mut value = 0u32;
        for _ in 0..digits {
            let Some(d) = self.peek().and_then(|b| (b as char).to_digit(16)) else {
                return Err(LiteralError::Syntax {
                    offset: at,
                    message: format!("truncated escape: {digits} hex digits required"),
                });
            };
            value = value * 16 + d;
            self.pos += 1;
        }
        Ok(value)
    }

    fn parse_number(&mut self) -> Result<PyValue, LiteralError> {
        let start = self.pos;
        if self.peek() == Some(b'0') {
            let radix = match self.peek_at(1) {
                Some(b'x' | b'X') => Some(16),
                Some(b'o' | b'O') => Some(8),
                Some(b'b' | b'B') => Some(2),
                _ => None,
            };
            if let Some(radix) = radix {
                return self.parse_radix_int(radix);
            }
        }
        let token = self.scan_decimal()?;
        if self.peek().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return self.syntax("invalid decimal literal");
        }
        if token.imag || token.float {
            let value = parse_f64(&token.text).ok_or_else(|| LiteralError::Syntax {
                offset: start,
                message: "invalid decimal literal".into(),
            })?;
            return Ok(if token.imag { PyValue::Complex(0.0, value) } else { PyValue::Float(value) });
        }
        if token.text.len() > 1 && token.text.starts_with('0') && token.text.bytes().any(|b| b != b'0') {
            return Err(LiteralError::Syntax {
                offset: start,
                message: "leading zeros in decimal integer literals are not permitted".into(),
            });
        }
        if token.text.len() > MAX_INT_DIGITS {
            return Err(LiteralError::Unsupported {
                offset: start,
                message: format!("integer literal with more than {MAX_INT_DIGITS} digits"),
            });
        }
        Ok(PyValue::Int(PyInt::from_sign_digits(false, &token.text)))
    }

    /// `0x…`, `0o…`, `0b…` (an `_` may precede every digit, the first included).
    fn parse_radix_int(&mut self, radix: u32) -> Result<PyValue, LiteralError> {
        let start = self.pos;
        self.pos += 2;
        let mut limbs = Limbs::default();
        let mut digits = 0usize;
        loop {
            let underscore = usize::from(self.peek() == Some(b'_'));
            let Some(d) = self.peek_at(underscore).and_then(|b| (b as char).to_digit(radix)) else {
                if underscore == 1 || digits == 0 {
                    return self.syntax("invalid integer literal");
                }
                break;
            };
            self.pos += underscore + 1;
            digits += 1;
            if digits > MAX_INT_DIGITS {
                return Err(LiteralError::Unsupported {
                    offset: start,
                    message: format!("integer literal with more than {MAX_INT_DIGITS} digits"),
                });
            }
            limbs.mul_add(radix, d);
        }
        if self.peek().is_some_and(|b| b.is_ascii_alphanumeric()) {
            return self.syntax("invalid digit in integer literal");
        }
        Ok(PyValue::Int(PyInt::from_sign_digits(false, &limbs.to_decimal())))
    }

    /// Digits, an optional fraction, an optional exponent and an optional `j`.
    fn scan_decimal(&mut self) -> Result<DecimalToken, LiteralError> {
        let mut text = String::new();
        let int_digits = self.scan_digits(&mut text)?;
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            text.push('.');
            float = true;
            if self.scan_digits(&mut text)? == 0 && int_digits == 0 {
                return self.syntax("invalid decimal literal");
            }
        } else if int_digits == 0 {
            return self.syntax("expected a number");
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let signed = matches!(self.peek_at(1), Some(b'+' | b'-'));
            let first_digit = if signed { 2 } else { 1 };
            if !matches!(self.peek_at(first_digit), Some(b'0'..=b'9')) {
                return self.syntax("invalid decimal literal");
            }
            text.push('e');
            if signed && self.peek_at(1) == Some(b'-') {
                text.push('-');
            }
            self.pos += first_digit;
            self.scan_digits(&mut text)?;
            float = true;
        }
        let imag = matches!(self.peek(), Some(b'j' | b'J'));
        if imag {
            self.pos += 1;
        }
        Ok(DecimalToken { text, float, imag })
    }

    /// Decimal digits with single `_` between them, appended to `text` without the `_`.
    fn scan_digits(&mut self, text: &mut String) -> Result<usize, LiteralError> {
        let mut count = 0;
        while let Some(b) = self.peek() {
            if b.is_ascii_digit() {
                text.push(b as char);
                count += 1;
                self.pos += 1;
            } else if b == b'_' {
                if count == 0 || !matches!(self.peek_at(1), Some(b'0'..=b'9')) {
                    return self.syntax("invalid decimal literal");
                }
                self.pos += 1;
            } else {
                break;
            }
        }
        Ok(count)
    }

    /// `name(args)` for a whitelisted constructor.
    fn parse_call(&mut self, name: &str, start: usize, depth: usize) -> Result<PyValue, LiteralError> {
        if !CONSTRUCTORS.contains(&name) {
            return Err(LiteralError::NotLiteral {
                offset: start,
                message: format!("call of `{name}` is not a trusted constructor"),
            });
        }
        self.pos += 1;
        let d = self.deeper(depth)?;
        let mut args = Vec::new();
        let mut kwargs: Vec<(String, PyValue)> = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                break;
            }
            if let Some(key) = self.keyword_name() {
                if kwargs.iter().any(|(k, _)| *k == key) {
                    return self.syntax(format!("keyword argument repeated: {key}"));
                }
                let value = self.parse_expr(d)?;
                kwargs.push((key, value));
            } else {
                if !kwargs.is_empty() {
                    return self.syntax("positional argument follows keyword argument");
                }
                args.push(self.parse_expr(d)?);
            }
            self.skip_ws();
            if self.eat(b')') {
                break;
            }
            self.expect(b',', "`,` or `)`")?;
        }
        construct(name, args, kwargs).map_err(|message| match message {
            Construct::Invalid(message) => LiteralError::Invalid { offset: start, message },
            Construct::Unsupported(message) => LiteralError::Unsupported { offset: start, message },
        })
    }

    /// `name=` of a keyword argument (consumed), or nothing (nothing consumed).
    fn keyword_name(&mut self) -> Option<String> {
        let save = self.pos;
        if !self.peek().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_') {
            return None;
        }
        let name = self.read_name();
        self.skip_ws();
        if self.peek() == Some(b'=') && self.peek_at(1) != Some(b'=') && !PY_KEYWORDS.contains(&name) {
            self.pos += 1;
            return Some(name.to_string());
        }
        self.pos = save;
        None
    }
}

/// Rust's float parser, on text already validated as a Python float literal.
fn parse_f64(text: &str) -> Option<f64> {
    text.parse().ok()
}

/// Why a constructor call failed.
enum Construct {
    /// Python would raise.
    Invalid(String),
    /// Python would not raise, but this parser declines.
    Unsupported(String),
}

/// Python's `name(*args, **kwargs)` for a whitelisted builtin constructor.
fn construct(name: &str, args: Vec<PyValue>, kwargs: Vec<(String, PyValue)>) -> Result<PyValue, Construct> {
    use Construct::{Invalid, Unsupported};
    if name != "dict" && !kwargs.is_empty() {
        return Err(Unsupported(format!("keyword arguments to {name}()")));
    }
    if args.len() > 1 {
        return Err(Invalid(format!("{name}() takes at most 1 argument ({} given)", args.len())));
    }
    let arg = args.into_iter().next();
    Ok(match name {
        "set" | "frozenset" => {
            let mut set = UniqueKeys::new();
            for item in arg.map(iterate).transpose().map_err(Invalid)?.unwrap_or_default() {
                set.insert(item).map_err(Invalid)?;
            }
            if name == "set" { PyValue::Set(set.keys) } else { PyValue::FrozenSet(set.keys) }
        }
        "tuple" => PyValue::Tuple(arg.map(iterate).transpose().map_err(Invalid)?.unwrap_or_default()),
        "list" => PyValue::List(arg.map(iterate).transpose().map_err(Invalid)?.unwrap_or_default()),
        "dict" => {
            let mut dict = DictBuilder::new();
            match arg {
                None => {}
                Some(PyValue::Dict(pairs)) => {
                    for (key, value) in pairs {
                        dict.insert(key, value).map_err(Invalid)?;
                    }
                }
                Some(other) => {
                    for (i, item) in iterate(other).map_err(Invalid)?.into_iter().enumerate() {
                        let pair = iterate(item).map_err(|_| {
                            Invalid(format!(
                                "cannot convert dictionary update sequence element #{i} to a sequence"
                            ))
                        })?;
                        let [key, value]: [PyValue; 2] = pair.try_into().map_err(|p: Vec<PyValue>| {
                            Invalid(format!(
                                "dictionary update sequence element #{i} has length {}; 2 is required",
                                p.len()
                            ))
                        })?;
                        dict.insert(key, value).map_err(Invalid)?;
                    }
                }
            }
            for (key, value) in kwargs {
                dict.insert(PyValue::Str(key), value).map_err(Invalid)?;
            }
            PyValue::Dict(dict.finish())
        }
        "float" => PyValue::Float(match arg {
            None => 0.0,
            Some(PyValue::Str(s)) => float_from_str(&s)
                .ok_or_else(|| Invalid(format!("could not convert string to float: {}", str_repr(&s))))?,
            Some(PyValue::Bool(b)) => f64::from(u8::from(b)),
            Some(PyValue::Int(i)) => {
                i.to_f64().ok_or_else(|| Invalid("int too large to convert to float".into()))?
            }
            Some(PyValue::Float(x)) => x,
            Some(other) => return Err(Invalid(format!("float() of a {}", other.type_name()))),
        }),
        "int" => PyValue::Int(match arg {
            None => PyInt::from_i128(0),
            Some(PyValue::Str(s)) => int_from_str(&s).ok_or_else(|| {
                Invalid(format!("invalid literal for int() with base 10: {}", str_repr(&s)))
            })?,
            Some(PyValue::Bool(b)) => PyInt::from_i128(i128::from(b)),
            Some(PyValue::Int(i)) => i,
            Some(PyValue::Float(x)) => PyInt::from_integral_f64(x.trunc())
                .ok_or_else(|| Invalid("cannot convert float infinity or NaN to integer".into()))?,
            Some(other) => return Err(Invalid(format!("int() of a {}", other.type_name()))),
        }),
        "str" => match arg {
            None => PyValue::Str(String::new()),
            Some(PyValue::Str(s)) => PyValue::Str(s),
            // For these, str() is repr(), which Display reproduces exactly.
            Some(v @ (PyValue::None | PyValue::Bool(_) | PyValue::Int(_) | PyValue::Float(_))) => {
                PyValue::Str(v.to_string())
            }
            Some(other) => return Err(Unsupported(format!("str() of a {}", other.type_name()))),
        },
        "bool" => PyValue::Bool(arg.as_ref().is_some_and(truthy)),
        other => return Err(Unsupported(format!("{other}() is not a trusted constructor"))),
    })
}

/// Python's `list(value)` for iterable literals (a dict yields its keys, a str its characters,
/// bytes their ints).
fn iterate(value: PyValue) -> Result<Vec<PyValue>, String> {
    Ok(match value {
        PyValue::List(items) | PyValue::Tuple(items) | PyValue::Set(items) | PyValue::FrozenSet(items) => {
            items
        }
        PyValue::Dict(pairs) => pairs.into_iter().map(|(key, _)| key).collect(),
        PyValue::Str(s) => s.chars().map(|c| PyValue::Str(c.to_string())).collect(),
        PyValue::Bytes(b) => b.into_iter().map(|byte| PyValue::int(i128::from(byte))).collect(),
        other => return Err(format!("'{}' object is not iterable", other.type_name())),
    })
}

/// Python's `float(text)`: surrounding whitespace, a sign, `inf`/`infinity`/`nan` in any case,
/// or a decimal literal with `_` separators.
fn float_from_str(text: &str) -> Option<f64> {
    let text = text.trim();
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = match body.to_ascii_lowercase().as_str() {
        "inf" | "infinity" => f64::INFINITY,
        "nan" => f64::NAN,
        _ => {
            let mut parser = Parser { src: body, pos: 0, mode: Mode::Source, brackets: 0, sets: 0 };
            if !matches!(parser.peek(), Some(b'0'..=b'9' | b'.')) {
                return None;
            }
            let token = parser.scan_decimal().ok()?;
            if token.imag || parser.pos != body.len() {
                return None;
            }
            parse_f64(&token.text)?
        }
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// Python's `int(text)` in base 10: surrounding whitespace, a sign, digits with `_` separators.
fn int_from_str(text: &str) -> Option<PyInt> {
    let text = text.trim();
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let mut parser = Parser { src: body, pos: 0, mode: Mode::Source, brackets: 0, sets: 0 };
    let mut digits = String::new();
    let count = parser.scan_digits(&mut digits).ok()?;
    if count == 0 || parser.pos != body.len() || count > MAX_INT_DIGITS {
        return None;
    }
    Some(PyInt::from_sign_digits(negative, &digits))
}

// ---------------------------------------------------------------------------------------------
// Assert splitter
// ---------------------------------------------------------------------------------------------

/// The comparison of a split assert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// `==`.
    Eq,
    /// `!=`.
    NotEq,
    /// `is`, against `None`, `True` or `False` only.
    Is,
    /// `is not`, against `None`, `True` or `False` only.
    IsNot,
    /// `math.isclose(got, expected, rel_tol=…, abs_tol=…)`: the tolerances as `f64` bits (so
    /// that the operator stays `Eq`); Python's formula, applied here.
    IsClose { rel_tol_bits: u64, abs_tol_bits: u64 },
}

impl CompareOp {
    /// The operator as written in Python.
    pub fn symbol(self) -> &'static str {
        match self {
            CompareOp::Eq => "==",
            CompareOp::NotEq => "!=",
            CompareOp::Is => "is",
            CompareOp::IsNot => "is not",
            CompareOp::IsClose { .. } => "isclose",
        }
    }
}

impl fmt::Display for CompareOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

/// How [`split_assert`] classified an assert statement.
#[derive(Debug, Clone)]
pub enum SplitAssert {
    /// A trusted comparison: the sandbox evaluates `expression` and reports its value; the
    /// verdict is [`compare`]`(op, reported, expected)`, computed here.
    Compare {
        /// The candidate-side Python expression, to `eval` in the sandbox (comments removed,
        /// line breaks outside brackets turned into spaces).
        expression: String,
        /// The expected value; never sent into the sandbox.
        expected: PyValue,
        /// The comparison.
        op: CompareOp,
    },
    /// Not splittable: the statement has to run whole in the sandbox, whose report of it
    /// cannot be trusted.
    Untrusted {
        /// Why (a short, stable phrase, suitable for counting).
        reason: String,
    },
}

/// Python's `got <op> expected`, where `got` is the value the sandbox reported.
pub fn compare(op: CompareOp, got: &PyValue, expected: &PyValue) -> bool {
    let same_singleton = || match (got, expected) {
        (PyValue::None, PyValue::None) => true,
        (PyValue::Bool(a), PyValue::Bool(b)) => a == b,
        _ => false,
    };
    match op {
        CompareOp::Eq => py_eq(got, expected),
        CompareOp::NotEq => !py_eq(got, expected),
        CompareOp::Is => same_singleton(),
        CompareOp::IsNot => !same_singleton(),
        CompareOp::IsClose { rel_tol_bits, abs_tol_bits } => {
            // math.isclose on a real number (a bool or int converts to float, as in Python); any
            // other value is its TypeError, a failure.
            let real = |v: &PyValue| match v {
                PyValue::Bool(b) => Some(f64::from(u8::from(*b))),
                PyValue::Int(i) => i.to_f64(),
                PyValue::Float(x) => Some(*x),
                _ => None,
            };
            let (Some(a), Some(b)) = (real(got), real(expected)) else { return false };
            is_close(a, b, f64::from_bits(rel_tol_bits), f64::from_bits(abs_tol_bits))
        }
    }
}

/// CPython's `math.isclose` (Modules/mathmodule.c): equal values are close; an infinity is
/// close only to itself; else `|b − a| ≤ rel_tol·|b|`, `≤ rel_tol·|a|` or `≤ abs_tol`. (Negative
/// tolerances are refused when the assert is split.)
fn is_close(a: f64, b: f64, rel_tol: f64, abs_tol: f64) -> bool {
    if a == b {
        return true;
    }
    if a.is_infinite() || b.is_infinite() {
        return false;
    }
    let diff = (b - a).abs();
    diff <= (rel_tol * b).abs() || diff <= (rel_tol * a).abs() || diff <= abs_tol
}

/// Splits an assert statement into the candidate-side expression and the expected literal.
///
/// Accepts `assert <a> == <b>` (also `!=`, and `is` / `is not` against `None`, `True`,
/// `False`), optionally with the whole comparison in parentheses and with a `, message` part
/// (dropped: Python evaluates it only on failure). The operator is found at the top level,
/// outside brackets, strings and comments. Normally the right side is the literal
/// ([`parse_literal`] syntax, except that bare `inf`/`nan` are names in source); when only the
/// left side is, the sides swap (`assert 5 == f(x)`).
///
/// Truthiness of a call chain — `assert f(x)`, `assert not f(x)`, `assert obj.m(x)[0]` — is a
/// value check too, with its polarity withheld: the guest evaluates `not not (f(x))` (Python's
/// own truth test of the value, whatever its type) and reports the resulting `bool`, and the
/// check here is that it `is True` (or `is False` for the negated assert). The guest sees the
/// same expression for both polarities, so a candidate that reports a constant fails every
/// problem whose asserts mix them (the MBPP problems with such asserts all do).
///
/// Untrusted, with a reason: anything but one assert statement; truthiness of anything but a
/// call chain; `math.isclose(…)` other than as above; chained or multiple comparisons; other comparison operators; top-level
/// `and`/`or`/`not`/conditional expressions/lambdas (where splitting at the operator would
/// change the meaning); neither side a literal; an asserted tuple (always true); f-strings;
/// unbalanced brackets or unterminated strings.
pub fn split_assert(statement: &str) -> SplitAssert {
    match split(statement) {
        Ok((expression, expected, op)) => SplitAssert::Compare { expression, expected, op },
        Err(reason) => SplitAssert::Untrusted { reason },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokKind {
    Name,
    Number,
    Str,
    Op,
    /// A whole bracketed group, `(…)`, `[…]` or `{…}`.
    Group,
    /// A line break outside brackets.
    Newline,
}

/// A top-level token: its kind and byte range in the statement.
#[derive(Debug, Clone, Copy)]
struct Tok {
    kind: TokKind,
    start: usize,
    end: usize,
}

/// The top-level tokens of a range of the statement, and the byte ranges to drop or blank
/// when copying text out of it (comments; line continuations).
struct Scan {
    tokens: Vec<Tok>,
    /// `(start, end, replacement)`.
    elided: Vec<(usize, usize, &'static str)>,
}

/// Operators and delimiters, longest first.
const OPERATORS: &[&str] = &[
    "**=", "//=", ">>=", "<<=", "...", "==", "!=", "<=", ">=", "<>", ":=", "->", "**", "//", "<<", ">>",
    "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "@=",
];

/// Tokenises `src[from..to]` at bracket depth 0 (`joined`: as if inside brackets, so line
/// breaks are whitespace).
fn scan(src: &str, from: usize, to: usize, joined: bool) -> Result<Scan, String> {
    let b = src.as_bytes();
    let mut tokens = Vec::new();
    let mut elided = Vec::new();
    let mut closers: Vec<u8> = Vec::new();
    let mut group_start = from;
    let mut pos = from;
    while pos < to {
        let c = b[pos];
        let top = closers.is_empty();
        let mut token = |kind, start, end| {
            if top {
                tokens.push(Tok { kind, start, end });
            }
        };
        match c {
            b' ' | b'\t' | 0x0c => pos += 1,
            b'\\' => {
                let len = match (b.get(pos + 1), b.get(pos + 2)) {
                    (Some(b'\r'), Some(b'\n')) => 3,
                    (Some(b'\n' | b'\r'), _) => 2,
                    _ => return Err("stray backslash".into()),
                };
                elided.push((pos, pos + len, " "));
                pos += len;
            }
            b'\n' | b'\r' => {
                if !joined {
                    token(TokKind::Newline, pos, pos + 1);
                }
                pos += 1;
            }
            b'#' => {
                let end = b[pos..to].iter().position(|&x| x == b'\n' || x == b'\r').map_or(to, |i| pos + i);
                elided.push((pos, end, ""));
                pos = end;
            }
            b'\'' | b'"' => {
                let end = skip_string(b, pos, to)?;
                token(TokKind::Str, pos, end);
                pos = end;
            }
            b'0'..=b'9' => {
                let end = skip_number(b, pos, to);
                token(TokKind::Number, pos, end);
                pos = end;
            }
            b'.' if b.get(pos + 1).is_some_and(u8::is_ascii_digit) => {
                let end = skip_number(b, pos, to);
                token(TokKind::Number, pos, end);
                pos = end;
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let mut end = pos;
                while end < to && (b[end].is_ascii_alphanumeric() || b[end] == b'_' || b[end] >= 0x80) {
                    end += 1;
                }
                if end < to
                    && matches!(b[end], b'\'' | b'"')
                    && let Some(kind) = string_prefix(&src[pos..end])
                {
                    if kind.format {
                        return Err("f-string in assert statement".into());
                    }
                    let string_end = skip_string(b, end, to)?;
                    token(TokKind::Str, pos, string_end);
                    pos = string_end;
                    continue;
                }
                token(TokKind::Name, pos, end);
                pos = end;
            }
            b'(' | b'[' | b'{' => {
                if top {
                    group_start = pos;
                }
                closers.push(match c {
                    b'(' => b')',
                    b'[' => b']',
                    _ => b'}',
                });
                pos += 1;
            }
            b')' | b']' | b'}' => {
                if closers.pop() != Some(c) {
                    return Err("unbalanced brackets".into());
                }
                pos += 1;
                if closers.is_empty() {
                    tokens.push(Tok { kind: TokKind::Group, start: group_start, end: pos });
                }
            }
            _ => {
                let rest = &b[pos..to];
                let len =
                    OPERATORS.iter().find(|op| rest.starts_with(op.as_bytes())).map_or(1, |op| op.len());
                token(TokKind::Op, pos, pos + len);
                pos += len;
            }
        }
    }
    if !closers.is_empty() {
        return Err("unbalanced brackets".into());
    }
    Ok(Scan { tokens, elided })
}

/// End of the string literal whose opening quote is at `pos`.
fn skip_string(b: &[u8], pos: usize, to: usize) -> Result<usize, String> {
    let quote = b[pos];
    let triple = pos + 2 < to && b[pos + 1] == quote && b[pos + 2] == quote;
    let mut i = pos + if triple { 3 } else { 1 };
    while i < to {
        match b[i] {
            b'\\' => i += if b.get(i + 1) == Some(&b'\r') && b.get(i + 2) == Some(&b'\n') { 3 } else { 2 },
            q if q == quote && !triple => return Ok(i + 1),
            q if q == quote && i + 3 <= to && b[i + 1] == quote && b[i + 2] == quote => return Ok(i + 3),
            b'\n' | b'\r' if !triple => return Err("unterminated string".into()),
            _ => i += 1,
        }
    }
    Err("unterminated string".into())
}

/// End of the number starting at `pos` (loosely: the sides are re-parsed later).
fn skip_number(b: &[u8], pos: usize, to: usize) -> usize {
    let hex = b.get(pos + 1).is_some_and(|&x| x == b'x' || x == b'X');
    let mut end = pos;
    while end < to {
        let c = b[end];
        let exponent_sign = (c == b'+' || c == b'-') && !hex && matches!(b[end - 1], b'e' | b'E');
        if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || exponent_sign {
            end += 1;
        } else {
            break;
        }
    }
    end
}

/// The source text of a run of top-level tokens: comments dropped, line continuations and
/// line breaks between tokens turned into spaces.
fn side_text(src: &str, tokens: &[Tok], elided: &[(usize, usize, &'static str)]) -> String {
    let mut out = String::new();
    for (i, tok) in tokens.iter().enumerate() {
        if i > 0 {
            let gap = &src[tokens[i - 1].end..tok.start];
            if !gap.is_empty() {
                out.push_str(if gap.bytes().all(|b| b == b' ' || b == b'\t') { gap } else { " " });
            }
        }
        let mut pos = tok.start;
        for &(start, end, replacement) in elided.iter().filter(|(s, _, _)| (tok.start..tok.end).contains(s)) {
            out.push_str(&src[pos..start]);
            out.push_str(replacement);
            pos = end;
        }
        out.push_str(&src[pos..tok.end]);
    }
    out
}

/// A truthiness assert of `tokens` (`negated`: `assert not …`) as a value check whose polarity
/// the guest never sees: expression `not not (…)`, expected `True` (or `False`), operator `is`.
/// Only a call chain — a name, then calls, subscripts and `.attribute`s — is taken: the
/// candidate's code is what the assert exercises.
fn truth_check(
    src: &str,
    tokens: &[Tok],
    negated: bool,
    elided: &[(usize, usize, &'static str)],
) -> Result<(String, PyValue, CompareOp), String> {
    let text = |t: &Tok| &src[t.start..t.end];
    let what = if negated { "negated truthiness" } else { "bare truthiness" };
    let Some((first, rest)) = tokens.split_first() else { return Err(format!("syntax: {what} of nothing")) };
    let keyword = matches!(text(first), "not" | "None" | "True" | "False" | "lambda" | "await" | "yield");
    if first.kind != TokKind::Name || keyword {
        return Err(format!("{what} of something other than a call chain"));
    }
    let mut i = 0;
    while i < rest.len() {
        match rest[i].kind {
            TokKind::Group => i += 1,
            TokKind::Op if text(&rest[i]) == "." && rest.get(i + 1).is_some_and(|n| n.kind == TokKind::Name) => i += 2,
            _ => return Err(format!("{what} of something other than a call chain")),
        }
    }
    if !rest.iter().any(|t| t.kind == TokKind::Group && src.as_bytes()[t.start] == b'(') {
        return Err(format!("{what} of something other than a call chain"));
    }
    let expression = format!("not not ({})", side_text(src, tokens, elided));
    Ok((expression, PyValue::Bool(!negated), CompareOp::Is))
}

/// The arguments of `math.isclose(…)` (source bytes `start..end`, inside the parentheses): the
/// candidate-side expression, the expected number and the tolerances (Python's defaults
/// `rel_tol=1e-09`, `abs_tol=0.0`).
fn split_isclose(src: &str, start: usize, end: usize) -> Result<(String, PyValue, CompareOp), String> {
    let syntax = |e: String| format!("syntax: {e}");
    let inner = scan(src, start, end, true).map_err(syntax)?;
    let text = |t: &Tok| &src[t.start..t.end];
    let mut args: Vec<&[Tok]> = inner.tokens.split(|t| t.kind == TokKind::Op && text(t) == ",").collect();
    if args.last().is_some_and(|a| a.is_empty()) {
        args.pop(); // a trailing comma
    }
    let source = |a: &[Tok]| match (a.first(), a.last()) {
        (Some(f), Some(l)) => Ok(src[f.start..l.end].to_string()),
        _ => Err("math.isclose with an empty argument".to_string()),
    };
    let number = |a: &[Tok]| -> Result<f64, String> {
        match parse_literal(&source(a)?) {
            Ok(PyValue::Int(i)) => i.to_f64().ok_or_else(|| "math.isclose tolerance out of range".to_string()),
            Ok(PyValue::Float(x)) => Ok(x),
            _ => Err("math.isclose tolerance is not a number literal".into()),
        }
    };
    let (mut positional, mut rel_tol, mut abs_tol, mut keyword_seen) = (Vec::new(), 1e-9, 0.0, false);
    for a in args {
        match a {
            [k, eq, value @ ..] if k.kind == TokKind::Name && eq.kind == TokKind::Op && text(eq) == "=" => {
                keyword_seen = true;
                match text(k) {
                    "rel_tol" => rel_tol = number(value)?,
                    "abs_tol" => abs_tol = number(value)?,
                    other => return Err(format!("math.isclose keyword `{other}`")),
                }
            }
            _ if keyword_seen => return Err("syntax: positional argument after a keyword".into()),
            _ => positional.push(source(a)?),
        }
    }
    if !(rel_tol >= 0.0 && abs_tol >= 0.0) {
        return Err("math.isclose with a negative tolerance".into());
    }
    let [x, y] = positional.as_slice() else {
        return Err(format!("math.isclose with {} positional arguments", positional.len()));
    };
    let is_number = |v: &PyValue| matches!(v, PyValue::Int(_) | PyValue::Float(_));
    let (expression, expected) = match (parse_literal(x), parse_literal(y)) {
        (_, Ok(v)) if is_number(&v) => (x.clone(), v),
        (Ok(v), _) if is_number(&v) => (y.clone(), v),
        _ => return Err("math.isclose without a number literal side".into()),
    };
    Ok((expression, expected, CompareOp::IsClose { rel_tol_bits: rel_tol.to_bits(), abs_tol_bits: abs_tol.to_bits() }))
}

fn split(src: &str) -> Result<(String, PyValue, CompareOp), String> {
    if src.len() > MAX_TEXT_LEN {
        return Err(format!("statement longer than {MAX_TEXT_LEN} bytes"));
    }
    let syntax = |e: String| format!("syntax: {e}");
    let scanned = scan(src, 0, src.len(), false).map_err(syntax)?;
    let text = |t: &Tok| &src[t.start..t.end];
    let is_op = |t: &Tok, op: &str| t.kind == TokKind::Op && text(t) == op;

    let mut statements =
        scanned.tokens.split(|t| t.kind == TokKind::Newline || is_op(t, ";")).filter(|s| !s.is_empty());
    let statement = statements.next().ok_or("empty statement")?;
    if statements.next().is_some() {
        return Err("more than one statement".into());
    }
    if statement[0].kind != TokKind::Name || text(&statement[0]) != "assert" {
        return Err("not an assert statement".into());
    }
    let body = &statement[1..];
    let comma = body.iter().position(|t| is_op(t, ","));
    if comma.is_some_and(|c| c + 1 == body.len()) {
        return Err("syntax: empty assert message".into());
    }
    let mut test: Vec<Tok> = body[..comma.unwrap_or(body.len())].to_vec();
    let mut stripped = 0;
    loop {
        match test.as_slice() {
            [] => return Err("syntax: empty assert".into()),
            [group] if group.kind == TokKind::Group && src.as_bytes()[group.start] == b'(' => {
                stripped += 1;
                if stripped > MAX_DEPTH {
                    return Err("too deeply parenthesised".into());
                }
                let inner = scan(src, group.start + 1, group.end - 1, true).map_err(syntax)?;
                if inner.tokens.is_empty() {
                    return Err("assert on an empty tuple is always false".into());
                }
                if inner.tokens.iter().any(|t| is_op(t, ",")) {
                    return Err("assert on a tuple is always true".into());
                }
                test = inner.tokens;
            }
            _ => break,
        }
    }

    // Top-level comparisons, as (operator, first token, last token).
    let mut comparisons: Vec<(&str, usize, usize)> = Vec::new();
    let mut standalone_not = None;
    let mut i = 0;
    while i < test.len() {
        let t = &test[i];
        let word = text(t);
        let next = test.get(i + 1).filter(|n| n.kind == TokKind::Name).map(text);
        match (t.kind, word) {
            (TokKind::Name, "is") if next == Some("not") => {
                comparisons.push(("is not", i, i + 1));
                i += 1;
            }
            (TokKind::Name, "not") if next == Some("in") => {
                comparisons.push(("not in", i, i + 1));
                i += 1;
            }
            (TokKind::Name, "is" | "in") => comparisons.push((word, i, i)),
            (TokKind::Name, "not") => {
                standalone_not.get_or_insert(i);
            }
            (TokKind::Name, "and" | "or") => return Err(format!("boolean operator `{word}`")),
            (TokKind::Name, "if" | "else") => return Err("conditional expression".into()),
            (TokKind::Name, "lambda") => return Err("lambda outside brackets".into()),
            (
                TokKind::Name,
                "yield" | "await" | "for" | "async" | "assert" | "del" | "import" | "from" | "def" | "class"
                | "return" | "pass" | "with" | "while" | "try" | "raise" | "global" | "nonlocal",
            ) => return Err(format!("syntax: keyword `{word}`")),
            (TokKind::Op, "==" | "!=" | "<" | ">" | "<=" | ">=" | "<>") => comparisons.push((word, i, i)),
            (TokKind::Op, ":=") => return Err("assignment expression".into()),
            (TokKind::Op, op) if op.ends_with('=') => return Err("syntax: assignment in assert".into()),
            _ => {}
        }
        i += 1;
    }
    if let Some(at) = standalone_not {
        if at == 0 && comparisons.is_empty() {
            return truth_check(src, &test[1..], true, &scanned.elided);
        }
        return Err("boolean operator `not`".into());
    }
    let (symbol, first, last) = match comparisons.as_slice() {
        [] => {
            // `math.isclose(<expression>, <number>[, rel_tol=<number>][, abs_tol=<number>])`:
            // a value check with Python's formula applied here.
            if let [m, dot, name, call] = test.as_slice()
                && m.kind == TokKind::Name
                && text(m) == "math"
                && is_op(dot, ".")
                && name.kind == TokKind::Name
                && text(name) == "isclose"
                && call.kind == TokKind::Group
                && src.as_bytes()[call.start] == b'('
            {
                return split_isclose(src, call.start + 1, call.end - 1);
            }
            let isclose = matches!(test.as_slice(), [.., name, call]
                if name.kind == TokKind::Name && text(name) == "isclose" && call.kind == TokKind::Group);
            if isclose {
                return Err("math.isclose is not a plain equality".into());
            }
            return truth_check(src, &test, false, &scanned.elided);
        }
        [one] => *one,
        _ => return Err("chained or multiple comparisons".into()),
    };
    let op = match symbol {
        "==" => CompareOp::Eq,
        "!=" => CompareOp::NotEq,
        "is" => CompareOp::Is,
        "is not" => CompareOp::IsNot,
        other => return Err(format!("comparison `{other}` is not supported")),
    };
    if first == 0 || last + 1 == test.len() {
        return Err("syntax: comparison without an operand".into());
    }
    let lhs = side_text(src, &test[..first], &scanned.elided);
    let rhs = side_text(src, &test[last + 1..], &scanned.elided);
    let (expression, expected) = match parse_with(&rhs, Mode::Source) {
        Ok(expected) => (lhs, expected),
        Err(_) => match parse_with(&lhs, Mode::Source) {
            Ok(expected) => (rhs, expected),
            Err(_) => return Err("neither side is a trusted literal".into()),
        },
    };
    if matches!(op, CompareOp::Is | CompareOp::IsNot) && !matches!(expected, PyValue::None | PyValue::Bool(_))
    {
        return Err("identity comparison with a value other than None, True, False".into());
    }
    Ok((expression, expected, op))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(text: &str) -> PyValue {
        match parse_literal(text) {
            Ok(value) => value,
            Err(e) => panic!("{text:?} should parse: {e}"),
        }
    }

    fn repr(text: &str) -> String {
        lit(text).to_string()
    }

    fn eq(a: &str, b: &str) -> bool {
        py_eq(&lit(a), &lit(b))
    }

    fn split_ok(statement: &str) -> (String, PyValue, CompareOp) {
        match split_assert(statement) {
            SplitAssert::Compare { expression, expected, op } => (expression, expected, op),
            SplitAssert::Untrusted { reason } => panic!("{statement:?} should split, got: {reason}"),
        }
    }

    fn untrusted(statement: &str) -> String {
        match split_assert(statement) {
            SplitAssert::Untrusted { reason } => reason,
            SplitAssert::Compare { expression, expected, .. } => {
                panic!("{statement:?} should be untrusted, split into {expression:?} == {expected}")
            }
        }
    }

    #[test]
    fn integers_in_every_spelling() {
        for (text, want) in [
            ("0", "0"),
            ("00", "0"),
            ("1_000_000", "1000000"),
            ("0x_ff", "255"),
            ("0XFF", "255"),
            ("0o17", "15"),
            ("0b101", "5"),
            ("-5", "-5"),
            ("+5", "5"),
            ("--5", "5"),
            ("- 5", "-5"),
            ("-True", "-1"),
            ("0xffffffffffffffffffffffffffffffffff", "87112285931760246646623899502532662132735"),
        ] {
            assert_eq!(repr(text), want, "{text}");
        }
        for bad in ["007", "1__0", "1_", "_1", "0b2", "0x", "0x_", "1a", "0o8"] {
            assert!(parse_literal(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn big_integers_are_exact_and_normalised() {
        let max = "170141183460469231731687303715884105727";
        let above = "170141183460469231731687303715884105728";
        assert_eq!(lit(max).to_string(), max);
        assert!(matches!(lit(max), PyValue::Int(ref i) if i.as_i128() == Some(i128::MAX)));
        assert!(matches!(lit(above), PyValue::Int(ref i) if i.as_i128().is_none()));
        // -2^127 comes out of negating a big literal and must be the small form again.
        assert!(matches!(lit(&format!("-{above}")), PyValue::Int(ref i) if i.as_i128() == Some(i128::MIN)));
        assert!(matches!(lit(&format!("--{above}")), PyValue::Int(ref i) if i.as_i128().is_none()));
        let huge = format!("1{}", "0".repeat(100));
        assert_eq!(repr(&huge), huge);
        assert_eq!(repr(&format!("-{huge}")), format!("-{huge}"));
        assert!(eq(&huge, &format!("0{}", &huge[1..]).replacen('0', "1", 1)));
        assert!(!eq(&huge, &format!("{huge}1")));
        assert!(matches!(
            parse_literal(&"9".repeat(MAX_INT_DIGITS + 1)),
            Err(LiteralError::Unsupported { .. })
        ));
        assert!(parse_literal(&"9".repeat(MAX_INT_DIGITS)).is_ok());
    }

    #[test]
    fn floats_parse_and_print_like_python() {
        for (text, want) in [
            ("1.5", "1.5"),
            ("1e-3", "0.001"),
            (".5", "0.5"),
            ("5.", "5.0"),
            ("1_0.2_5", "10.25"),
            ("1E5", "100000.0"),
            ("007.5", "7.5"),
            ("1e16", "1e+16"),
            ("1e15", "1000000000000000.0"),
            ("1e-5", "1e-05"),
            ("0.0001", "0.0001"),
            ("-0.0", "-0.0"),
            ("0.1", "0.1"),
            ("1.5e300", "1.5e+300"),
            ("5e-324", "5e-324"),
            ("123456789012345678.0", "1.2345678901234568e+17"),
            ("1e400", "inf"),
            ("inf", "inf"),
            ("-inf", "-inf"),
            ("nan", "nan"),
            ("float('inf')", "inf"),
            ("float('-Infinity')", "-inf"),
            ("float(\"1.5\")", "1.5"),
            ("float(' 1_0 ')", "10.0"),
            ("float(3)", "3.0"),
        ] {
            assert_eq!(repr(text), want, "{text}");
        }
        assert!(matches!(lit("float('nan')"), PyValue::Float(x) if x.is_nan()));
        for bad in ["1e", "1e+", "1._5", "1.5_", "float('1j')", "float('x')", "float('0x10')", "float([])"] {
            assert!(parse_literal(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn complex_numbers() {
        for (text, want) in [
            ("2j", "2j"),
            ("1J", "1j"),
            ("(1+2j)", "(1+2j)"),
            ("1+2j", "(1+2j)"),
            ("1 - 2.5j", "(1-2.5j)"),
            ("(-0-3.5j)", "-3.5j"),
            ("-2j", "(-0-2j)"),
            ("(1.5+0j)", "(1.5+0j)"),
            ("1e16+1j", "(1e+16+1j)"),
            ("(inf+nanj)", "(inf+nanj)"),
            ("infj", "infj"),
            ("(1-infj)", "(1-infj)"),
            ("[1+2j, -1-2j]", "[(1+2j), (-1-2j)]"),
        ] {
            assert_eq!(repr(text), want, "{text}");
        }
        for bad in ["1+2", "2j+1", "1+2j+3", "1+-2j", "'a'+1j", "True+1j", "1*2j"] {
            assert!(parse_literal(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn string_escapes_prefixes_and_concatenation() {
        for (text, want) in [
            (r"'\x41\u00e9\U0001F600'", "Aé😀"),
            (r#"'\n\t\r\\\'\"\a\b\f\v'"#, "\n\t\r\\'\"\x07\x08\x0c\x0b"),
            (r"'\101\0\7777'", "A\0\u{1ff}7"),
            (r"'\d\w'", r"\d\w"),
            (r"r'\n\''", r"\n\'"),
            (r"R'\x'", r"\x"),
            ("'a' \"b\" '''c'''", "abc"),
            ("'''line\nbreak'''", "line\nbreak"),
            ("\"\"\"it's \"quoted\" ok\"\"\"", "it's \"quoted\" ok"),
            ("u'x' U'y'", "xy"),
            ("'a\\\nb'", "ab"),
            ("'=='", "=="),
            ("'é'", "é"),
        ] {
            match lit(text) {
                PyValue::Str(s) => assert_eq!(s, want, "{text}"),
                other => panic!("{text} gave {other:?}"),
            }
        }
        for (text, want) in [
            (r"b'\xff\x00a'", &b"\xff\x00a"[..]),
            (r"B'\u1234'", br"\u1234"),
            (r"rb'\n'", br"\n"),
            (r"Br'\n'", br"\n"),
            (r"b'a' b'b'", b"ab"),
            (r"b'\101'", b"A"),
        ] {
            match lit(text) {
                PyValue::Bytes(b) => assert_eq!(b, want, "{text}"),
                other => panic!("{text} gave {other:?}"),
            }
        }
        for bad in [
            "'a' b'b'",
            "'unterminated",
            "'a\nb'",
            "b'é'",
            r"b'\777'",
            r"'\x4'",
            r"'\u12'",
            "'''open",
            "x'a'",
        ] {
            assert!(parse_literal(bad).is_err(), "{bad} should not parse");
        }
        assert!(matches!(parse_literal("f'x'"), Err(LiteralError::NotLiteral { .. })));
        assert!(matches!(parse_literal(r"'\N{DASH}'"), Err(LiteralError::Unsupported { .. })));
        assert!(matches!(parse_literal(r"'\ud800'"), Err(LiteralError::Unsupported { .. })));
        assert!(matches!(parse_literal(r"'\U00110000'"), Err(LiteralError::Unsupported { .. })));
    }

    #[test]
    fn strings_print_like_python_repr() {
        for (value, want) in [
            ("abc", "'abc'"),
            ("it's", "\"it's\""),
            ("'\"", r#"'\'"'"#),
            ("a\\b", r"'a\\b'"),
            ("\n\t\r\x00\x1b\x7f", r"'\n\t\r\x00\x1b\x7f'"),
            ("é😀", "'é😀'"),
            ("\u{a0}\u{ad}\u{2028}\u{e000}\u{feff}\u{10ffff}", r"'\xa0\xad\u2028\ue000\ufeff\U0010ffff'"),
        ] {
            assert_eq!(PyValue::str(value).to_string(), want, "{value:?}");
        }
        assert_eq!(PyValue::Bytes(b"it's\x7f\\\n".to_vec()).to_string(), r#"b"it's\x7f\\\n""#);
        assert_eq!(PyValue::Bytes(b"'\"".to_vec()).to_string(), r#"b'\'"'"#);
        assert_eq!(PyValue::Bytes(Vec::new()).to_string(), "b''");
    }

    #[test]
    fn containers() {
        for (text, want) in [
            ("()", "()"),
            ("(1,)", "(1,)"),
            ("(1)", "1"),
            ("((1, 2), )", "((1, 2),)"),
            ("[1, [2, (3,)], {'a': [None]}]", "[1, [2, (3,)], {'a': [None]}]"),
            ("[\n 1, # one\n 2,\n]", "[1, 2]"),
            ("{}", "{}"),
            ("{1: 'a', 2: 'b',}", "{1: 'a', 2: 'b'}"),
            ("{1, 2}", "{1, 2}"),
            ("{1, 1.0, True}", "{1}"),
            ("{1: 'a', 1.0: 'b', True: 'c'}", "{1: 'c'}"),
            ("{(1, 2), (1.0, 2.0)}", "{(1, 2)}"),
            ("{frozenset({1}), frozenset({1.0})}", "{frozenset({1})}"),
            ("set()", "set()"),
            ("set((4, 5))", "{4, 5}"),
            ("set(['a', 'b', 'a'])", "{'a', 'b'}"),
            ("set('aba')", "{'a', 'b'}"),
            ("set({1: 2})", "{1}"),
            ("frozenset()", "frozenset()"),
            ("frozenset({1, 2})", "frozenset({1, 2})"),
            ("tuple([1, 2])", "(1, 2)"),
            ("tuple('ab')", "('a', 'b')"),
            ("list((1,))", "[1]"),
            ("list(b'ab')", "[97, 98]"),
            ("dict()", "{}"),
            ("dict([(1, 2), [3, 4]])", "{1: 2, 3: 4}"),
            ("dict(['ab'])", "{'a': 'b'}"),
            ("dict(a=1, b=2)", "{'a': 1, 'b': 2}"),
            ("dict({1: 2}, c=3)", "{1: 2, 'c': 3}"),
            ("int('42')", "42"),
            ("int(' -4_2 ')", "-42"),
            ("int(3.9)", "3"),
            ("int(-3.9)", "-3"),
            ("int(1e20)", "100000000000000000000"),
            ("int(True)", "1"),
            ("str(5)", "'5'"),
            ("str(1.5)", "'1.5'"),
            ("str(None)", "'None'"),
            ("str('x')", "'x'"),
            ("bool([])", "False"),
            ("bool((0,))", "True"),
            ("set ( [1] )", "{1}"),
        ] {
            assert_eq!(repr(text), want, "{text}");
        }
        for bad in [
            "{[1]}",
            "{(1, [2])}",
            "{{}: 1}",
            "set([[1]])",
            "dict([1])",
            "dict([(1, 2, 3)])",
            "set([1], [2])",
            "int('x')",
            "int(float('nan'))",
            "int('1.5')",
            "str([1])",
            "sorted([2, 1])",
            "foo(1)",
            "set(x)",
            "set(*[1])",
            "dict(a=1, a=2)",
            "dict(as=1)",
            "dict(True=1)",
            "dict(a=1, [])",
            "[1, 2",
            "[1,,]",
            "[,]",
            "(1 2)",
            "1, 2",
            "{1: 2, 3}",
            "{1, 2: 3}",
            "x",
            "math.pi",
            "[i for i in x]",
            "...",
            "-'a'",
            "-[1]",
            "",
            "   ",
        ] {
            assert!(parse_literal(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn line_breaks_only_inside_brackets() {
        assert_eq!(repr("\n 2 \n# trailing comment\n"), "2");
        assert_eq!(repr("(-\n2)"), "-2");
        assert_eq!(repr("['a'\n 'b']"), "['ab']");
        assert_eq!(repr("-\\\n2"), "-2");
        for bad in ["-\n2", "set\n()", "'a'\n'b'", "1\n+2j"] {
            assert!(parse_literal(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn hostile_input_is_refused_without_overflowing_the_stack() {
        let deep = 100_000;
        for text in [
            "[".repeat(deep),
            format!("{}1{}", "[".repeat(deep), "]".repeat(deep)),
            "(".repeat(deep),
            format!("{}1", "-".repeat(deep)),
            "{1: ".repeat(deep),
            "set(".repeat(deep),
            format!("{}1{}", "(".repeat(deep), ")".repeat(deep)),
        ] {
            assert!(matches!(parse_literal(&text), Err(LiteralError::TooDeep { .. })), "{}", &text[..20]);
        }
        let ok_depth = MAX_DEPTH - 1;
        let nested = format!("{}{}", "[".repeat(ok_depth), "]".repeat(ok_depth));
        let value = lit(&nested);
        assert!(py_eq(&value, &value.clone()));
        assert_eq!(value.to_string(), nested);
        let long = "1".repeat(MAX_TEXT_LEN + 1);
        assert!(matches!(parse_literal(&long), Err(LiteralError::TooLong { .. })));
        // Many nans in one set stay linear (each is distinct, as in Python).
        let nans = format!("{{{}}}", vec!["nan"; 20_000].join(", "));
        assert!(matches!(lit(&nans), PyValue::Set(items) if items.len() == 20_000));
        // Sets and dicts nest at most MAX_SET_DEPTH deep, and compare in time linear in their
        // depth, not exponential.
        let depth = MAX_SET_DEPTH / 2;
        for text in [
            format!("{}(1, 2){}", "frozenset({".repeat(depth), "})".repeat(depth)),
            format!("{}0{}", "{1: ".repeat(MAX_SET_DEPTH), "}".repeat(MAX_SET_DEPTH)),
            format!("{}0{}", "{1: 0, 2: ".repeat(MAX_SET_DEPTH), "}".repeat(MAX_SET_DEPTH)),
            // Two equal deep elements: deduplicating them compares them level by level once.
            {
                let deep = format!("{}(1,){}", "frozenset({".repeat(depth - 1), "})".repeat(depth - 1));
                format!("{{{deep}, {deep}}}")
            },
        ] {
            let value = lit(&text);
            assert!(py_eq(&value, &value.clone()), "{}", &text[..40]);
        }
        for text in [
            format!("{}(1, 2){}", "frozenset({".repeat(depth + 1), "})".repeat(depth + 1)),
            format!("{}0{}", "{1: ".repeat(MAX_SET_DEPTH + 1), "}".repeat(MAX_SET_DEPTH + 1)),
            format!("{}{}", "set([".repeat(MAX_SET_DEPTH + 1), "])".repeat(MAX_SET_DEPTH + 1)),
        ] {
            assert_eq!(parse_literal(&text).unwrap_err(), LiteralError::TooDeep { limit: MAX_SET_DEPTH });
        }
        // A deeply parenthesised assert is untrusted, not a stack overflow.
        let statement = format!("assert {}f(x) == 1{}", "(".repeat(deep), ")".repeat(deep));
        assert_eq!(untrusted(&statement), "too deeply parenthesised");
    }

    #[test]
    fn numbers_compare_across_types() {
        assert!(eq("True", "1"));
        assert!(eq("1", "1.0"));
        assert!(eq("1.0", "(1+0j)"));
        assert!(eq("True", "(1+0j)"));
        assert!(eq("False", "0.0"));
        assert!(eq("-0.0", "0"));
        assert!(eq("0j", "0"));
        assert!(eq("(-0-0j)", "0.0"));
        assert!(!eq("1", "(1+1j)"));
        assert!(eq("(1+2j)", "(1.0+2.0j)"));
        assert!(!eq("nan", "nan"));
        assert!(!eq("[nan]", "[nan]"));
        assert!(eq("inf", "float('inf')"));
        assert!(!eq("inf", "-inf"));
        // Exact int/float comparison: 2**53 + 1 is not the float 2.0**53.
        assert!(!eq("9007199254740993", "9007199254740992.0"));
        assert!(eq("9007199254740992", "9007199254740992.0"));
        // Above i128: 10**40 is not the float 1e40, but the float's exact value is.
        let ten_40 = format!("1{}", "0".repeat(40));
        assert!(!eq(&ten_40, "1e40"));
        assert!(eq("10000000000000000303786028427003666890752", "1e40"));
        assert!(eq("-10000000000000000303786028427003666890752", "-1e40"));
        assert!(eq("170141183460469231731687303715884105728", "1.7014118346046923e+38"));
        assert!(eq("-170141183460469231731687303715884105728", "-1.7014118346046923e+38"));
        assert!(!eq("1.5", "1"));
        assert!(!eq("1", "'1'"));
        assert!(!eq("0", "None"));
        assert!(eq("0", "False"));
        assert!(!eq("2", "True"));
    }

    #[test]
    fn containers_compare_like_python() {
        assert!(eq("'a'", "'a'"));
        assert!(!eq("'a'", "b'a'"));
        assert!(!eq("'a'", "['a']"));
        assert!(eq("b'a'", "b'a'"));
        assert!(eq("[1, 2]", "[1.0, 2]"));
        assert!(!eq("[1, 2]", "[2, 1]"));
        assert!(!eq("[1, 2]", "(1, 2)"));
        assert!(!eq("[1]", "[1, 1]"));
        assert!(eq("(1, (2, [3]))", "(True, (2.0, [3+0j]))"));
        assert!(eq("{1, 2, 3}", "{3, 2, 1}"));
        assert!(eq("{1, 2}", "frozenset({2, 1})"));
        assert!(eq("set()", "frozenset()"));
        assert!(!eq("set()", "{}"));
        assert!(!eq("{1, 2}", "{1}"));
        assert!(!eq("{1, 2}", "[1, 2]"));
        assert!(eq("{(1, 2), (3, 4)}", "{(3, 4), (1, 2)}"));
        assert!(eq("{(1, 2), (3, 4)}", "set([(3.0, 4), (1, 2.0)])"));
        assert!(!eq("{(1, 2)}", "{(2, 1)}"));
        assert!(eq("{frozenset({1, 2}), 3}", "{3, frozenset({2, 1})}"));
        assert!(!eq("{nan}", "{nan}"));
        assert!(eq("{'a': 1, 'b': [2]}", "{'b': [2.0], 'a': True}"));
        assert!(!eq("{'a': 1}", "{'a': 2}"));
        assert!(!eq("{'a': 1}", "{'a': 1, 'b': 2}"));
        assert!(eq("{1: 'x'}", "{1.0: 'x'}"));
        assert!(eq("{(1, 2): {3: [4]}}", "{(1, 2): {3: [4]}}"));
        assert!(eq("{}", "dict()"));
        // Hand-built values with duplicates or unhashable elements still compare as sets.
        let dup = PyValue::Set(vec![PyValue::int(1), PyValue::int(1)]);
        assert!(py_eq(&dup, &lit("{1}")));
        let odd = PyValue::Set(vec![PyValue::List(vec![PyValue::int(1)])]);
        assert!(py_eq(&odd, &odd.clone()));
        assert!(!py_eq(&odd, &lit("{1}")));
    }

    #[test]
    fn truthiness() {
        for text in [
            "True",
            "1",
            "-1",
            "0.5",
            "nan",
            "1j",
            "'a'",
            "b'a'",
            "[0]",
            "(0,)",
            "{0}",
            "{0: 0}",
            "frozenset({0})",
        ] {
            assert!(truthy(&lit(text)), "{text}");
        }
        for text in
            ["False", "None", "0", "0.0", "-0.0", "0j", "''", "b''", "[]", "()", "set()", "{}", "frozenset()"]
        {
            assert!(!truthy(&lit(text)), "{text}");
        }
        let big = format!("1{}", "0".repeat(50));
        assert!(truthy(&lit(&big)));
    }

    #[test]
    fn split_plain_equalities() {
        let (expression, expected, op) = split_ok("assert f(2) == 5");
        assert_eq!((expression.as_str(), expected.to_string(), op), ("f(2)", "5".to_string(), CompareOp::Eq));
        let (expression, expected, _) = split_ok("assert heap_queue_largest( [25, 35, 22],3)==[35, 25]");
        assert_eq!(expression, "heap_queue_largest( [25, 35, 22],3)");
        assert_eq!(expected.to_string(), "[35, 25]");
        let (expression, expected, _) =
            split_ok("assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))");
        assert_eq!(expression, "set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10)))");
        assert!(py_eq(&expected, &lit("{4, 5}")));
        let (_, expected, op) = split_ok("assert f(x) != None");
        assert!(matches!((expected, op), (PyValue::None, CompareOp::NotEq)));
        let (expression, expected, op) = split_ok("  assert f(x) is None  ");
        assert_eq!(expression, "f(x)");
        assert!(matches!((expected, op), (PyValue::None, CompareOp::Is)));
        let (_, expected, op) = split_ok("assert f(x) is not True;");
        assert!(matches!((expected, op), (PyValue::Bool(true), CompareOp::IsNot)));
        let (_, expected, _) = split_ok("assert f(x) == -1.5");
        assert_eq!(expected.to_string(), "-1.5");
    }

    #[test]
    fn split_finds_the_operator_outside_strings_brackets_and_comments() {
        let (expression, expected, _) = split_ok(r#"assert f("a == b", 'c) # [') == 'x == "y"' # a == 2"#);
        assert_eq!(expression, r#"f("a == b", 'c) # [')"#);
        assert_eq!(expected.to_string(), r#"'x == "y"'"#);
        let (expression, expected, _) = split_ok(r"assert f('it\'s == ok') == 'it\'s'");
        assert_eq!(expression, r"f('it\'s == ok')");
        assert_eq!(expected.to_string(), "\"it's\"");
        let (expression, _, _) = split_ok("assert f([1, 2] == [1, 2], {'k': (3 == 3)}) == True");
        assert_eq!(expression, "f([1, 2] == [1, 2], {'k': (3 == 3)})");
        let (expression, _, _) = split_ok("assert f('''a\n== b''') == 1");
        assert_eq!(expression, "f('''a\n== b''')");
        let (expression, expected, _) = split_ok("assert f(1, # a comment == here\n 2) == [1, # one\n 2]");
        assert_eq!(expression, "f(1, \n 2)");
        assert_eq!(expected.to_string(), "[1, 2]");
        let (expression, _, _) = split_ok("assert f(1) \\\n == 2");
        assert_eq!(expression, "f(1)");
        let (expression, _, _) = split_ok("assert (f(1)\n + 1 == 2)");
        assert_eq!(expression, "f(1) + 1");
    }

    #[test]
    fn split_drops_messages_and_outer_parentheses() {
        let (expression, expected, _) = split_ok(r#"assert f(x) == 5, "f(x) should == 5, not " + str(f(x))"#);
        assert_eq!((expression.as_str(), expected.to_string()), ("f(x)", "5".to_string()));
        let (expression, _, _) = split_ok("assert (f(x) == 5)");
        assert_eq!(expression, "f(x)");
        let (expression, _, _) = split_ok("assert((f(x) == (5))), 'msg'");
        assert_eq!(expression, "f(x)");
        let (expression, expected, _) = split_ok("assert (a, b) == (1, 2)");
        assert_eq!((expression.as_str(), expected.to_string()), ("(a, b)", "(1, 2)".to_string()));
        assert_eq!(untrusted("assert (f(x) == 5, 'msg')"), "assert on a tuple is always true");
        assert_eq!(untrusted("assert f(x) == 5,"), "syntax: empty assert message");
    }

    #[test]
    fn split_swaps_a_literal_left_side() {
        let (expression, expected, op) = split_ok("assert 5 == f(x)");
        assert_eq!((expression.as_str(), expected.to_string(), op), ("f(x)", "5".to_string(), CompareOp::Eq));
        let (expression, expected, _) = split_ok("assert [1, 'a'] == g(h(1), 'a')");
        assert_eq!((expression.as_str(), expected.to_string()), ("g(h(1), 'a')", "[1, 'a']".to_string()));
        let (expression, _, op) = split_ok("assert None is f()");
        assert_eq!((expression.as_str(), op), ("f()", CompareOp::Is));
        // Both literal: the right side is the expected value.
        let (expression, expected, _) = split_ok("assert 1 == 2");
        assert_eq!((expression.as_str(), expected.to_string()), ("1", "2".to_string()));
    }

    #[test]
    fn math_isclose_is_a_value_check_with_pythons_formula() {
        let SplitAssert::Compare { expression, expected, op } =
            split_assert("assert math.isclose(volume_sphere(10), 4188.790204786391, rel_tol=0.001)")
        else {
            panic!("math.isclose with a number literal splits")
        };
        assert_eq!((expression.as_str(), op.symbol()), ("volume_sphere(10)", "isclose"));
        let close = |got: PyValue| compare(op, &got, &expected);
        // Within 0.1 % of 4188.79… (either side's magnitude), not beyond; ints and bools are
        // numbers; anything else is Python's TypeError, a failure.
        assert!(close(PyValue::Float(4188.790204786391)) && close(PyValue::Float(4185.0)) && close(PyValue::Float(4192.0)));
        assert!(!close(PyValue::Float(4180.0)) && !close(PyValue::Float(f64::NAN)) && !close(PyValue::Float(f64::INFINITY)));
        assert!(close(parse_literal("4189").expect("int")));
        assert!(!close(PyValue::None) && !close(PyValue::Str("4188.79".into())));
        // The literal on either side, the defaults (rel_tol 1e-09, abs_tol 0), abs_tol, a
        // trailing comma.
        let check = |statement: &str, got: f64| match split_assert(statement) {
            SplitAssert::Compare { expected, op, .. } => compare(op, &PyValue::Float(got), &expected),
            SplitAssert::Untrusted { reason } => panic!("{statement}: {reason}"),
        };
        assert!(check("assert math.isclose(2.5, f(1))", 2.5 + 1e-12) && !check("assert math.isclose(2.5, f(1))", 2.5 + 1e-6));
        assert!(check("assert math.isclose(f(1), 0, abs_tol=1e-6,)", 5e-7) && !check("assert math.isclose(f(1), 0)", 5e-7));
    }

    #[test]
    fn truthiness_of_a_call_chain_is_a_check_whose_polarity_the_guest_never_sees() {
        for (statement, expression, expected) in [
            ("assert f(x)", "not not (f(x))", true),
            ("assert not f(x)", "not not (f(x))", false),
            ("assert (not is_prime(8))", "not not (is_prime(8))", false),
            ("assert obj.check( 'a' )[0]", "not not (obj.check( 'a' )[0])", true),
            ("assert is_perfect_square(14*14), 'square'", "not not (is_perfect_square(14*14))", true),
        ] {
            let (e, v, op) = split_ok(statement);
            assert_eq!((e.as_str(), op), (expression, CompareOp::Is), "{statement}");
            assert!(matches!(v, PyValue::Bool(b) if b == expected), "{statement}: {v}");
        }
        // Comments and line continuations inside the call are elided as for any split.
        let (e, _, _) = split_ok("assert f(1,  # one\n  2) \\\n  [0]");
        assert_eq!(e, "not not (f(1,  \n  2) [0])");
        // The guest reports the bool it computed; the polarity decides here.
        let (_, expected, op) = split_ok("assert not check(1)");
        assert!(compare(op, &PyValue::Bool(false), &expected) && !compare(op, &PyValue::Bool(true), &expected));
        assert!(!compare(op, &PyValue::Int(PyInt::from_i128(0)), &expected), "only a bool passes `is False`");
    }

    #[test]
    fn split_refuses_what_it_cannot_trust() {
        let cases = [
            ("assert x", "bare truthiness of something other than a call chain"),
            ("assert not x + f(1)", "negated truthiness of something other than a call chain"),
            ("assert [f(x)]", "bare truthiness of something other than a call chain"),
            ("assert f(x) + 1", "bare truthiness of something other than a call chain"),
            ("assert not not f(x)", "negated truthiness of something other than a call chain"),
            ("assert isclose(f(1), 2.5)", "math.isclose is not a plain equality"),
            ("assert math.isclose(f(1), g(2))", "math.isclose without a number literal side"),
            ("assert math.isclose(f(1), 2.5, rel_tol=-0.1)", "math.isclose with a negative tolerance"),
            ("assert math.isclose(f(1), 2.5, tol=0.1)", "math.isclose keyword `tol`"),
            ("assert math.isclose(f(1))", "math.isclose with 1 positional arguments"),
            ("assert math.isclose(f(1), 2.5, rel_tol=x)", "math.isclose tolerance is not a number literal"),
            ("assert math.isclose(f(1), rel_tol=1e-09, 2.5)", "syntax: positional argument after a keyword"),
            ("assert 1 < f(x) < 3", "chained or multiple comparisons"),
            ("assert f(x) == 1 == g(x)", "chained or multiple comparisons"),
            ("assert f(x) == g(x)", "neither side is a trusted literal"),
            ("assert f(x) == inf", "neither side is a trusted literal"),
            ("assert sys.getsizeof((1, 2)) == sys.getsizeof(('a',))", "neither side is a trusted literal"),
            ("assert f(x) < 3", "comparison `<` is not supported"),
            ("assert f(x) >= 3", "comparison `>=` is not supported"),
            ("assert 3 in f(x)", "comparison `in` is not supported"),
            ("assert 3 not in f(x)", "comparison `not in` is not supported"),
            ("assert not f(x) == 5", "boolean operator `not`"),
            ("assert f(x) == 1 and g(x) == 2", "boolean operator `and`"),
            ("assert f(x) == 1 or True", "boolean operator `or`"),
            ("assert f(x) == 1 if c else True", "conditional expression"),
            ("assert f(x) is 5", "identity comparison with a value other than None, True, False"),
            ("assert f(x) == 1; assert g() == 2", "more than one statement"),
            ("assert f(x) == 1\nassert g() == 2", "more than one statement"),
            ("x = 1", "not an assert statement"),
            ("print(f(x) == 1)", "not an assert statement"),
            ("", "empty statement"),
            ("# only a comment", "empty statement"),
            ("assert", "syntax: empty assert"),
            ("assert ()", "assert on an empty tuple is always false"),
            ("assert f(x == 1", "syntax: unbalanced brackets"),
            ("assert f(x)) == 1", "syntax: unbalanced brackets"),
            ("assert f('x) == 1", "syntax: unterminated string"),
            ("assert f(x) == f'{y}'", "syntax: f-string in assert statement"),
            ("assert == 1", "syntax: comparison without an operand"),
            ("assert f(x) ==", "syntax: comparison without an operand"),
            ("assert (y := f(x)) == 1 and y", "boolean operator `and`"),
            ("assert y := 1", "assignment expression"),
        ];
        for (statement, reason) in cases {
            assert_eq!(untrusted(statement), reason, "{statement:?}");
        }
    }

    #[test]
    fn compare_applies_the_operator() {
        assert!(compare(CompareOp::Eq, &lit("4"), &lit("4.0")));
        assert!(!compare(CompareOp::Eq, &lit("4"), &lit("5")));
        assert!(compare(CompareOp::NotEq, &lit("4"), &lit("5")));
        assert!(compare(CompareOp::NotEq, &lit("nan"), &lit("nan")));
        assert!(compare(CompareOp::Is, &lit("None"), &lit("None")));
        assert!(compare(CompareOp::Is, &lit("True"), &lit("True")));
        assert!(!compare(CompareOp::Is, &lit("1"), &lit("True")));
        assert!(!compare(CompareOp::Is, &lit("False"), &lit("None")));
        assert!(compare(CompareOp::IsNot, &lit("0"), &lit("None")));
        assert_eq!(
            format!("assert f(2) {} 5 -> got {}", CompareOp::Eq, lit("4")),
            "assert f(2) == 5 -> got 4"
        );
    }

    /// Names a reference solution defines at the top level (`def`, `class`, assignment).
    fn defined_names(code: &str) -> Vec<String> {
        let mut names = Vec::new();
        for line in code.lines() {
            let line = line.trim_end();
            let rest = line
                .strip_prefix("def ")
                .or_else(|| line.strip_prefix("class "))
                .or_else(|| line.strip_prefix("async def "));
            let candidate = match rest {
                Some(rest) => rest,
                None if line.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && line.contains('=') =>
                {
                    line
                }
                None => continue,
            };
            let name: String =
                candidate.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                names.push(name);
            }
        }
        names
    }

    fn identifiers(text: &str) -> Vec<&str> {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect()
    }

    fn has_nan(value: &PyValue) -> bool {
        match value {
            PyValue::Float(x) => x.is_nan(),
            PyValue::Complex(re, im) => re.is_nan() || im.is_nan(),
            PyValue::List(items)
            | PyValue::Tuple(items)
            | PyValue::Set(items)
            | PyValue::FrozenSet(items) => items.iter().any(has_nan),
            PyValue::Dict(pairs) => pairs.iter().any(|(k, v)| has_nan(k) || has_nan(v)),
            _ => false,
        }
    }

    #[test]
    fn mbpp_asserts_split_as_trusted() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../workflows/datasets/mbpp/sanitized-mbpp.json");
        let text = std::fs::read_to_string(path).expect("the MBPP dataset ships with the repository");
        let tasks: Vec<serde_json::Value> = serde_json::from_str(&text).expect("the dataset is a JSON array");
        let mut total = 0usize;
        let mut trusted = 0usize;
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for task in &tasks {
            let id = &task["task_id"];
            let code = task["code"].as_str().expect("every task has reference code");
            assert!(!code.trim().is_empty(), "task {id}: empty reference code");
            let defined = defined_names(code);
            let tests = task["test_list"].as_array().expect("every task has a test list");
            assert!(!tests.is_empty(), "task {id}: no tests");
            for test in tests {
                let statement = test.as_str().expect("tests are strings");
                total += 1;
                match split_assert(statement) {
                    SplitAssert::Compare { expression, expected, op } => {
                        trusted += 1;
                        // Structural sanity against the reference solution: the expression
                        // calls into it, and re-splitting what we would report is stable.
                        assert!(
                            !expression.trim().is_empty(),
                            "task {id}: empty expression in {statement:?}"
                        );
                        assert!(
                            identifiers(&expression).iter().any(|w| defined.iter().any(|d| d == w)),
                            "task {id}: {expression:?} uses nothing the reference code defines ({defined:?})"
                        );
                        assert!(
                            scan(&expression, 0, expression.len(), true).is_ok(),
                            "task {id}: {expression:?} is not balanced"
                        );
                        let shown = expected.to_string();
                        let reparsed =
                            parse_literal(&shown).unwrap_or_else(|e| panic!("task {id}: {shown:?}: {e}"));
                        assert!(has_nan(&expected) || py_eq(&reparsed, &expected), "task {id}: {shown}");
                        assert_eq!(reparsed.to_string(), shown, "task {id}: Display is not a fixed point");
                        let truth = expression.strip_prefix("not not (").and_then(|e| e.strip_suffix(')'));
                        let again = match (op, truth) {
                            // A truthiness check: the assert it stands for.
                            (CompareOp::Is, Some(inner)) => match expected {
                                PyValue::Bool(true) => format!("assert {inner}"),
                                _ => format!("assert not {inner}"),
                            },
                            (CompareOp::IsClose { rel_tol_bits, abs_tol_bits }, _) => format!(
                                "assert math.isclose({expression}, {shown}, rel_tol={}, abs_tol={})",
                                PyValue::Float(f64::from_bits(rel_tol_bits)),
                                PyValue::Float(f64::from_bits(abs_tol_bits))
                            ),
                            _ => format!("assert {expression} {op} {shown}"),
                        };
                        match split_assert(&again) {
                            SplitAssert::Compare { expression: e2, expected: x2, op: o2 } => {
                                assert_eq!((e2.as_str(), o2), (expression.as_str(), op), "task {id}");
                                assert!(has_nan(&x2) || py_eq(&x2, &expected), "task {id}");
                            }
                            SplitAssert::Untrusted { reason } => panic!("task {id}: {again:?}: {reason}"),
                        }
                    }
                    SplitAssert::Untrusted { reason } => {
                        assert!(!reason.is_empty());
                        *reasons.entry(reason).or_default() += 1;
                    }
                }
            }
        }
        let share = trusted as f64 / total as f64;
        eprintln!("MBPP sanitized: {trusted}/{total} asserts split as trusted ({:.1}%)", 100.0 * share);
        let mut by_count: Vec<_> = reasons.into_iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (reason, count) in &by_count {
            eprintln!("  untrusted {count:4}  {reason}");
        }
        assert!(share >= 0.90, "only {:.1}% of the MBPP asserts split as trusted", 100.0 * share);
    }

    use std::collections::BTreeMap;
}
