//! TEMPORARY interface stub; the real bootstrap lands from the `boot` branch.
use crate::error::{Error, Result};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootstrapId {
    pub magic: u64,
    pub root: std::net::SocketAddr,
}
impl BootstrapId {
    pub fn to_unique_id(&self) -> crate::types::ncclUniqueId {
        crate::types::ncclUniqueId { internal: [0; 128] }
    }
    pub fn from_unique_id(_id: &crate::types::ncclUniqueId) -> Result<BootstrapId> {
        Err(Error::Internal("stub".into()))
    }
}
pub fn new_unique_id() -> Result<BootstrapId> {
    Err(Error::Internal("stub".into()))
}
pub struct Bootstrap;
impl Bootstrap {
    pub fn init(_id: &BootstrapId, _rank: usize, _nranks: usize, _timeout: Duration) -> Result<Bootstrap> {
        Err(Error::Internal("stub".into()))
    }
    pub fn rank(&self) -> usize { 0 }
    pub fn nranks(&self) -> usize { 0 }
    pub fn allgather(&self, _mine: &[u8]) -> Result<Vec<Vec<u8>>> { Err(Error::Internal("stub".into())) }
    pub fn broadcast(&self, _root: usize, _data: Option<&[u8]>) -> Result<Vec<u8>> { Err(Error::Internal("stub".into())) }
    pub fn barrier(&self) -> Result<()> { Err(Error::Internal("stub".into())) }
    pub fn send(&self, _peer: usize, _tag: u32, _data: &[u8]) -> Result<()> { Err(Error::Internal("stub".into())) }
    pub fn recv(&self, _peer: usize, _tag: u32) -> Result<Vec<u8>> { Err(Error::Internal("stub".into())) }
}
