//! Encryption at rest, as a StorageClass asks for it and a volume records it.

/// A volume encrypted with LUKS2 (the only format localvol makes), opened at stage with
/// the passphrase of its node-stage Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Encryption {
    /// Whether discards reach the device through dm-crypt (cryptsetup's
    /// `--allow-discards`). Off unless the StorageClass opts in: discards show which
    /// blocks of the ciphertext are in use, and without them ReclaimSpace frees
    /// nothing on this volume.
    pub allow_discards: bool,
}

impl Encryption {
    /// The value of the StorageClass parameter, and of the LV tag and record field.
    pub const LUKS2: &'static str = "luks2";
}

impl Encryption {
    /// How a volume's record stores it: `luks2`, or `luks2+discards`.
    pub fn as_str(&self) -> &'static str {
        if self.allow_discards {
            "luks2+discards"
        } else {
            Self::LUKS2
        }
    }

    /// The reverse of [`as_str`](Self::as_str).
    pub fn parse(stored: &str) -> Option<Self> {
        match stored {
            "luks2" => Some(Self {
                allow_discards: false,
            }),
            "luks2+discards" => Some(Self { allow_discards: true }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_form_round_trips() {
        for allow_discards in [false, true] {
            let e = Encryption { allow_discards };
            assert_eq!(Encryption::parse(e.as_str()), Some(e));
        }
        assert_eq!(Encryption::parse("luks1"), None);
        assert_eq!(Encryption::parse(""), None);
    }
}
