//! Sizes: the bytes a volume may be given, and the error when a request is not valid.

use super::IdError;

/// Largest volume localvol accepts a request for (1 PiB): anything bigger is a typo.
pub const MAX_VOLUME_BYTES: u64 = 1 << 50;
/// Size of a volume created without a capacity range.
pub const DEFAULT_VOLUME_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("{field} is required")]
    Missing { field: &'static str },
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("capacity range cannot be met: {0}")]
    OutOfRange(String),
    #[error(transparent)]
    Id(#[from] IdError),
    /// CSI asks for ABORTED when a listing cannot resume from the token given.
    #[error("starting_token {0:?} does not name a volume to resume after")]
    StaleToken(String),
}

/// A capacity range as bytes: at least `required`, at most `limit` (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityRange {
    pub required: u64,
    pub limit: Option<u64>,
}

impl CapacityRange {
    /// The size to allocate: `required` (or the default) rounded up to `alignment`,
    /// refused when rounding overshoots the limit.
    pub fn size_for(&self, alignment: u64) -> Result<u64, ValidationError> {
        let wanted = self.wanted();
        let size = wanted.div_ceil(alignment).max(1) * alignment;
        match self.limit {
            Some(limit) if size > limit => Err(ValidationError::OutOfRange(format!(
                "the smallest size this device class can allocate for {wanted} bytes is {size}, above the limit of {limit}"
            ))),
            _ => Ok(size),
        }
    }

    /// The bytes asked for: `required`, or without it the default within the limit.
    fn wanted(&self) -> u64 {
        if self.required == 0 {
            self.limit
                .map_or(DEFAULT_VOLUME_BYTES, |l| l.min(DEFAULT_VOLUME_BYTES))
        } else {
            self.required
        }
    }

    /// The range asking for at least `min` bytes, what `what` (a filesystem) needs to
    /// exist at all; OUT_OF_RANGE naming the minimum when the limit is below it. A
    /// request under the minimum is raised to it, as the CSI spec lets a plugin give
    /// more than `required` within the limit.
    pub fn at_least(self, min: u64, what: &str) -> Result<Self, ValidationError> {
        match self.limit {
            Some(limit) if limit < min => Err(ValidationError::OutOfRange(format!(
                "{what} needs at least {min} bytes, above the limit of {limit}"
            ))),
            _ if self.wanted() < min => Ok(Self {
                required: min,
                ..self
            }),
            _ => Ok(self),
        }
    }

    pub fn contains(&self, size: u64) -> bool {
        size >= self.required && self.limit.is_none_or(|l| size <= l)
    }
}
