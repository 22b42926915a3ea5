//! The null provider: every control operation succeeds at once and
//! workloads go to fio's `null` engine, which moves no data. Its figures
//! are the ceiling of what the orchestrator itself can drive.

use super::{Detail, Provider, Stages};

/// A provider that does nothing, instantly.
#[derive(Default)]
pub struct NullProvider;

impl Provider for NullProvider {
    fn name(&self) -> &'static str {
        "null"
    }

    fn create_volume(
        &self,
        _name: &str,
        _size: u64,
        _cluster_size: Option<u64>,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        stages.mark("created");
        stages.mark("attached");
        Ok(None)
    }

    fn attach_volume(&self, _volume: &str, stages: &mut Stages) -> Result<Detail, String> {
        stages.mark("attached");
        Ok(None)
    }

    fn delete_volume(&self, _name: &str) -> Result<Detail, String> {
        Ok(None)
    }

    fn snapshot(&self, _volume: &str, _snapshot: &str) -> Result<Detail, String> {
        Ok(None)
    }

    fn delete_snapshot(&self, _volume: &str, _snapshot: &str) -> Result<Detail, String> {
        Ok(None)
    }

    fn clone_snapshot(
        &self,
        _volume: &str,
        _snapshot: &str,
        _new: &str,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        stages.mark("created");
        stages.mark("attached");
        Ok(None)
    }

    fn resize(&self, _volume: &str, _size: u64) -> Result<Detail, String> {
        Ok(None)
    }

    fn compact(&self, _volume: &str, stages: &mut Stages) -> Result<Detail, String> {
        stages.mark("accepted");
        Ok(None)
    }

    fn fio_target(&self, _volume: &str, size: u64) -> Vec<String> {
        vec!["--ioengine=null".into(), format!("--size={size}")]
    }

    fn uri(&self, _volume: &str) -> Option<String> {
        None
    }

    fn stores_data(&self) -> bool {
        false
    }

    fn volumes_named(&self, _prefix: &str) -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }
}
