//! [`Device`]: where work runs (`auto | cpu | gpu`), the same option for builds, GROUP BYs and
//! lookups, with or without the `cuda` feature.
//!
//! The ground floor: this module names no other part of the crate, so every layer (core, gpu,
//! datafusion, cli) can take a `Device`. What a device choice resolves to (a usable GPU, a build
//! solver) is decided above it, in [`crate::placement`].

use std::str::FromStr;

/// Where a build runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The GPU when one is usable and the build is large enough to pay off.
    #[default]
    Auto,
    /// Always the CPU.
    Cpu,
    /// The GPU (falls back to the CPU with a notice when no GPU is usable).
    Gpu,
}

/// Parsing keeps `String` as its error, the standard library's pattern for `FromStr` (clap and
/// the SQL options print it as is); it is not a GPU failure.
impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu),
            other => Err(format!("unknown device '{other}' (expected auto, cpu or gpu)")),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}
