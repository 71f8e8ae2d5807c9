//! Memory sizes as people write them: `80GiB`, `512MiB`, or plain bytes. Binary units
//! only: `80GB` is refused, since GPU vendors and users disagree on what it means.

/// Parses a size (`40GiB`, `512`); the error says what was expected (`40GB` is refused).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let count: u64 = digits
        .parse()
        .map_err(|_| "expected a whole number followed by a unit, such as 80GiB".to_string())?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => return Err("expected unit B, KiB, MiB, GiB or TiB".to_string()),
    };
    count
        .checked_mul(1 << shift)
        .ok_or_else(|| "too large".to_string())
}

/// The largest binary unit that divides `bytes` exactly, so that what a user wrote
/// reads back the same (`40GiB`, `1536MiB`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_units_and_bytes() {
        assert_eq!(parse_size("80GiB"), Ok(80 << 30));
        assert_eq!(parse_size(" 512 MiB "), Ok(512 << 20));
        assert_eq!(parse_size("1024"), Ok(1024));
    }

    #[test]
    fn refuses_decimal_units_and_junk() {
        for bad in ["80GB", "GiB", "-1GiB", "1.5GiB", ""] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_size("99999999999TiB"), Err("too large".into()));
    }

    #[test]
    fn formats_round_trip() {
        for s in ["40GiB", "1536MiB", "3KiB", "7B", "2TiB"] {
            assert_eq!(format_size(parse_size(s).unwrap()), s);
        }
    }
}
