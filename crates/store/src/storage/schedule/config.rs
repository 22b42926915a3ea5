//! The operator's RS3 settings and their validation.

use std::collections::BTreeMap;
use std::fmt;

/// Smallest batch budget: below this the thesis measured the CPU, not the
/// disk, limiting throughput (§4.5.1: 11 MB/s at 1 KiB batches).
pub const MIN_BATCH_BYTES: u64 = 64 * 1024;

/// Largest batch budget: a batch this big already delays a small request
/// by the time to send 1 GiB.
pub const MAX_BATCH_BYTES: u64 = 1024 * 1024 * 1024;

/// The batch budget used when none is configured (the thesis's figures
/// go up to 256 KiB).
pub const DEFAULT_BATCH_BYTES: u64 = 256 * 1024;

/// Smallest class weight.
pub const MIN_WEIGHT: u32 = 1;

/// Largest class weight: a 1000:1 ratio is already far past any service
/// level one node could tell apart.
pub const MAX_WEIGHT: u32 = 1000;

/// Most classes the weight table may name.
pub const MAX_WEIGHTED_CLASSES: usize = 1024;

/// Longest class name, in bytes (a tenant id's limit).
pub const MAX_CLASS_NAME: usize = 64;

const _: () =
    assert!(MIN_BATCH_BYTES <= DEFAULT_BATCH_BYTES && DEFAULT_BATCH_BYTES <= MAX_BATCH_BYTES);
const _: () = assert!(MIN_WEIGHT >= 1 && MIN_WEIGHT <= MAX_WEIGHT);

/// RS3's settings on a storage node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// Whether reads are scheduled in batches at all.
    pub enabled: bool,
    /// Each batch's byte budget, [`MIN_BATCH_BYTES`] to [`MAX_BATCH_BYTES`].
    pub batch_bytes: u64,
    /// Weights of named classes (by default tenant ids), each
    /// [`MIN_WEIGHT`] to [`MAX_WEIGHT`]; at most [`MAX_WEIGHTED_CLASSES`].
    pub weights: BTreeMap<String, u32>,
    /// The weight of every class not named in `weights`.
    pub default_weight: u32,
    /// Tenants put in a class other than their own id (several tenants
    /// may share one); at most [`MAX_WEIGHTED_CLASSES`].
    pub classes: BTreeMap<String, String>,
}

impl Default for ScheduleConfig {
    /// Off, 256 KiB batches, every class weight 1 (plain RS3).
    fn default() -> ScheduleConfig {
        ScheduleConfig {
            enabled: false,
            batch_bytes: DEFAULT_BATCH_BYTES,
            weights: BTreeMap::new(),
            default_weight: 1,
            classes: BTreeMap::new(),
        }
    }
}

impl ScheduleConfig {
    /// Checks every bound; the error names the setting, the value and the
    /// allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(MIN_BATCH_BYTES..=MAX_BATCH_BYTES).contains(&self.batch_bytes) {
            return Err(ConfigError::BatchBytes(self.batch_bytes));
        }
        if !(MIN_WEIGHT..=MAX_WEIGHT).contains(&self.default_weight) {
            return Err(ConfigError::DefaultWeight(self.default_weight));
        }
        if self.weights.len() > MAX_WEIGHTED_CLASSES {
            return Err(ConfigError::TooManyClasses(self.weights.len()));
        }
        if self.classes.len() > MAX_WEIGHTED_CLASSES {
            return Err(ConfigError::TooManyClasses(self.classes.len()));
        }
        for (tenant, class) in &self.classes {
            for name in [tenant, class] {
                if !is_class_name(name) {
                    return Err(ConfigError::ClassName(name.clone()));
                }
            }
        }
        for (class, &weight) in &self.weights {
            if !is_class_name(class) {
                return Err(ConfigError::ClassName(class.clone()));
            }
            if !(MIN_WEIGHT..=MAX_WEIGHT).contains(&weight) {
                return Err(ConfigError::Weight {
                    class: class.clone(),
                    weight,
                });
            }
        }
        Ok(())
    }

    /// These settings changed by `text`, one `key=value` per line, as
    /// `strata store schedule` sends them: `rs3=on|off`, `batch=BYTES`,
    /// `weight=CLASS:W`, `unweight=CLASS`, `class=TENANT:CLASS`,
    /// `unclass=TENANT`. The result is checked; the error names the line.
    pub fn with_settings(&self, text: &str) -> Result<ScheduleConfig, String> {
        let mut config = self.clone();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let bad = |why: &str| format!("RS3 setting {line:?}: {why}");
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| bad("expected key=value"))?;
            let pair = || {
                value
                    .split_once(':')
                    .ok_or_else(|| bad("expected NAME:VALUE"))
            };
            match key {
                "rs3" => {
                    config.enabled = match value {
                        "on" => true,
                        "off" => false,
                        _ => return Err(bad("use on or off")),
                    }
                }
                "batch" => {
                    config.batch_bytes = value.parse().map_err(|_| bad("not a byte count"))?
                }
                "weight" => {
                    let (class, weight) = pair()?;
                    let weight = weight.parse().map_err(|_| bad("not a weight"))?;
                    config.weights.insert(class.to_string(), weight);
                }
                "unweight" => {
                    config.weights.remove(value);
                }
                "class" => {
                    let (tenant, class) = pair()?;
                    config.classes.insert(tenant.to_string(), class.to_string());
                }
                "unclass" => {
                    config.classes.remove(value);
                }
                _ => {
                    return Err(bad(
                        "unknown key (rs3, batch, weight, unweight, class, unclass)",
                    ))
                }
            }
        }
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// The settings as `key=value` lines, as [`ScheduleConfig::with_settings`]
    /// reads them.
    pub fn to_settings(&self) -> String {
        let mut text = format!(
            "rs3={}\nbatch={}\n",
            if self.enabled { "on" } else { "off" },
            self.batch_bytes
        );
        for (class, weight) in &self.weights {
            text.push_str(&format!("weight={class}:{weight}\n"));
        }
        for (tenant, class) in &self.classes {
            text.push_str(&format!("class={tenant}:{class}\n"));
        }
        text
    }

    /// The class of a read by `tenant`: its configured class, or its own
    /// id; a node's own reads (no tenant) are class `*`.
    pub fn class_of<'a>(&'a self, tenant: &'a str) -> &'a str {
        if tenant.is_empty() {
            return "*";
        }
        self.classes.get(tenant).map_or(tenant, String::as_str)
    }

    /// The weight of class `class`.
    pub fn weight_of(&self, class: &str) -> u32 {
        self.weights
            .get(class)
            .copied()
            .unwrap_or(self.default_weight)
    }
}

/// Whether `name` may name a class: `*` (the administrator's and the
/// nodes' own requests), or 1 to [`MAX_CLASS_NAME`] bytes of ASCII
/// letters, digits, `.`, `_` and `-` (the characters of a tenant id).
pub fn is_class_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    name == "*" || (!name.is_empty() && name.len() <= MAX_CLASS_NAME && name.chars().all(allowed))
}

/// A setting out of its bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The batch budget is out of bounds.
    BatchBytes(u64),
    /// The default weight is out of bounds.
    DefaultWeight(u32),
    /// The weight table names too many classes.
    TooManyClasses(usize),
    /// A class name in the weight table is not valid.
    ClassName(String),
    /// The sender's thread could not be started.
    Thread(String),
    /// A class's weight is out of bounds.
    Weight {
        /// The class.
        class: String,
        /// Its weight.
        weight: u32,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::BatchBytes(bytes) => write!(
                formatter,
                "RS3 batch budget of {bytes} bytes is out of bounds: use {MIN_BATCH_BYTES} (64 KiB) \
                 to {MAX_BATCH_BYTES} (1 GiB) bytes"
            ),
            ConfigError::DefaultWeight(weight) => write!(
                formatter,
                "RS3 default class weight {weight} is out of bounds: use {MIN_WEIGHT} to {MAX_WEIGHT}"
            ),
            ConfigError::TooManyClasses(count) => write!(
                formatter,
                "RS3 weight table names {count} classes, more than the limit of \
                 {MAX_WEIGHTED_CLASSES}: give the others the default weight"
            ),
            ConfigError::ClassName(class) => write!(
                formatter,
                "RS3 settings name class or tenant {class:?}, which is not a class name: use '*' or 1 to \
                 {MAX_CLASS_NAME} ASCII letters, digits, '.', '_' or '-' (a tenant id)"
            ),
            ConfigError::Thread(why) => write!(formatter, "could not start the RS3 sender's thread: {why}"),
            ConfigError::Weight { class, weight } => write!(
                formatter,
                "RS3 weight {weight} of class {class:?} is out of bounds: use {MIN_WEIGHT} to {MAX_WEIGHT}"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_configuration_is_valid_and_off() {
        let config = ScheduleConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert!(!config.enabled);
        assert_eq!(config.weight_of("anyone"), 1);
    }

    #[test]
    fn a_batch_budget_out_of_bounds_is_refused_with_the_range() {
        for bytes in [0, MIN_BATCH_BYTES - 1, MAX_BATCH_BYTES + 1] {
            let config = ScheduleConfig {
                batch_bytes: bytes,
                ..ScheduleConfig::default()
            };
            let error = config.validate().unwrap_err();
            assert_eq!(error, ConfigError::BatchBytes(bytes));
            assert!(error.to_string().contains("64 KiB"), "{error}");
        }
        for bytes in [MIN_BATCH_BYTES, MAX_BATCH_BYTES] {
            let config = ScheduleConfig {
                batch_bytes: bytes,
                ..ScheduleConfig::default()
            };
            assert_eq!(config.validate(), Ok(()));
        }
    }

    #[test]
    fn weights_out_of_bounds_and_bad_class_names_are_refused() {
        let mut config = ScheduleConfig {
            default_weight: 0,
            ..ScheduleConfig::default()
        };
        assert_eq!(config.validate(), Err(ConfigError::DefaultWeight(0)));
        config.default_weight = 1000;
        config.weights.insert("tenant-a".into(), 1001);
        let error = config.validate().unwrap_err();
        assert!(error.to_string().contains("\"tenant-a\""), "{error}");
        config.weights.insert("tenant-a".into(), 1000);
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.weight_of("tenant-a"), 1000);
        config.weights.insert("no/slash".into(), 2);
        assert_eq!(
            config.validate(),
            Err(ConfigError::ClassName("no/slash".into()))
        );
    }

    #[test]
    fn a_weight_table_past_its_limit_is_refused() {
        let mut config = ScheduleConfig::default();
        for n in 0..MAX_WEIGHTED_CLASSES {
            config.weights.insert(format!("t{n}"), 2);
        }
        assert_eq!(config.validate(), Ok(()));
        config.weights.insert("one-more".into(), 2);
        assert_eq!(
            config.validate(),
            Err(ConfigError::TooManyClasses(MAX_WEIGHTED_CLASSES + 1))
        );
    }

    #[test]
    fn reads_are_classed_by_tenant_unless_mapped_and_nodes_are_class_star() {
        let mut config = ScheduleConfig::default();
        config.classes.insert("acme".into(), "gold".into());
        assert_eq!(config.class_of("acme"), "gold");
        assert_eq!(config.class_of("bee"), "bee");
        assert_eq!(config.class_of(""), "*");
        config.classes.insert("bad/name".into(), "gold".into());
        assert_eq!(
            config.validate(),
            Err(ConfigError::ClassName("bad/name".into()))
        );
    }

    #[test]
    fn settings_text_changes_what_it_names_and_round_trips() {
        let config = ScheduleConfig::default()
            .with_settings("rs3=on\nbatch=131072\nweight=a:3\nclass=t:a\n")
            .expect("valid settings");
        assert!(config.enabled);
        assert_eq!(config.batch_bytes, 131072);
        assert_eq!(config.weight_of("a"), 3);
        assert_eq!(config.class_of("t"), "a");
        assert_eq!(
            ScheduleConfig::default().with_settings(&config.to_settings()),
            Ok(config.clone())
        );
        let fewer = config
            .with_settings("unweight=a\nunclass=t\nrs3=off")
            .expect("valid");
        assert_eq!(
            fewer,
            ScheduleConfig::default()
                .with_settings("batch=131072")
                .expect("valid")
        );
        for (bad, says) in [
            ("rs3=maybe", "use on or off"),
            ("batch=12", "out of bounds"),
            ("weight=a", "NAME:VALUE"),
            ("weight=a:0", "out of bounds"),
            ("colour=red", "unknown key"),
            ("class=t:bad/class", "not a class name"),
        ] {
            let err = config.with_settings(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
