//! Percent-decoding, in one place: query strings (where `+` is a space, as forms encode
//! it) and URL-encoded documents such as IAM policies (RFC 3986, where `+` is itself).
//! Malformed escapes are kept as they are, never an error: the decoded text is compared
//! or parsed next, and that step reports what is wrong. Pure, so the console (a
//! sign-in link's `next=`) and the server share it.

/// Decodes RFC 3986 percent-escapes.
pub fn percent_decode(s: &str) -> String {
    decode(s, false)
}

/// Decodes `application/x-www-form-urlencoded` text: percent-escapes and `+` as space.
pub fn form_decode(s: &str) -> String {
    decode(s, true)
}

fn decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    // `to_digit`, not `from_str_radix`: the latter reads "%+1" as the byte 0x01.
    let hex = |b: u8| char::from(b).to_digit(16);
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| {
                Some((
                    bytes.get(i + 1).copied().and_then(hex)?,
                    bytes.get(i + 2).copied().and_then(hex)?,
                ))
            })
            .flatten();
        match (bytes[i], escaped) {
            (_, Some((hi, lo))) => {
                out.push((hi * 16 + lo) as u8);
                i += 2;
            }
            (b'+', None) if plus_is_space => out.push(b' '),
            (b, None) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_and_bad_ones_stay() {
        assert_eq!(form_decode("cluster%2Fml-1"), "cluster/ml-1");
        assert_eq!(form_decode("a+b"), "a b");
        assert_eq!(percent_decode("a+b"), "a+b");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%7B%7D"), "{}");
        assert_eq!(percent_decode("%2"), "%2");
        assert_eq!(percent_decode("%+1"), "%+1");
    }
}
