//! Percent-decoding, in one place: query strings (where `+` is a space, as forms encode
//! it) and URL-encoded documents such as IAM policies (RFC 3986, where `+` is itself).
//! Malformed escapes are kept as they are, never an error: the decoded text is compared
//! or parsed next, and that step reports what is wrong.

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
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
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
    }
}
