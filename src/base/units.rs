//! Memory sizes as people write them: `80GiB`, `512MiB`, or plain bytes, in any case.
//! Every unit is binary: `80GB` and `40gb` mean GiB, as GPU names use them (an "A100
//! 80GB" has 81920 MiB, and nvidia-smi says MiB), so a size copied from a card's name asks
//! for that card.

/// Parses a size (`40GiB`, `40gb`, `512`); the error says what was expected.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let count: u64 = digits
        .parse()
        .map_err(|_| "expected a whole number followed by a unit, such as 80GiB".to_string())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err("expected unit B, KiB, MiB, GiB or TiB".to_string()),
    };
    count
        .checked_mul(1 << shift)
        .ok_or_else(|| "too large".to_string())
}

/// The largest binary unit that divides `bytes` exactly, so that what a user wrote
/// reads back the same (`40GiB`, `1536MiB`).
pub(crate) fn format_size(bytes: u64) -> String {
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
    fn units_as_card_names_and_people_write_them_are_binary() {
        for (text, bytes) in [("40GB", 40 << 30), ("40gb", 40 << 30), ("40gib", 40 << 30)] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        assert_eq!(parse_size("512mb"), Ok(512 << 20));
    }

    #[test]
    fn refuses_junk() {
        for bad in ["GiB", "-1GiB", "1.5GiB", "", "40 gigs"] {
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
