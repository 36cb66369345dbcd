//! etcd's own access control for the backend: a user and password, TLS with a client
//! certificate; from [`EtcdSettings`] or the environment.

use super::record::metadata;
use super::{EtcdSettings, EtcdTls, EtcdUser};
use crate::error::{Error, Result};
use etcd_client::{Certificate, Identity, TlsOptions};
use std::path::{Path, PathBuf};

/// The user named by `GPU_RDMA_ETCD_USER`, whose password is in the file named by this.
pub const PASSWORD_FILE_ENV: &str = "GPU_RDMA_ETCD_PASSWORD_FILE";

/// Variable `name` (unset or empty: `None`); a value that is not UTF-8 is refused, never
/// taken for unset.
fn var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v).filter(|v| !v.is_empty())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::Settings(format!(
            "{name}={}: not UTF-8",
            v.to_string_lossy()
        ))),
    }
}

/// [`EtcdSettings::user`], or the one in the environment.
pub(super) fn user(s: &EtcdSettings) -> Result<Option<EtcdUser>> {
    if let Some(u) = &s.user {
        return Ok(Some(u.clone()));
    }
    let Some(name) = var("GPU_RDMA_ETCD_USER")? else {
        return Ok(None);
    };
    let Some(file) = var(PASSWORD_FILE_ENV)? else {
        return Err(Error::Settings(format!(
            "GPU_RDMA_ETCD_USER={name} without {PASSWORD_FILE_ENV} (a file holding the password)"
        )));
    };
    let password = std::fs::read_to_string(&file)
        .map_err(|e| Error::Settings(format!("{PASSWORD_FILE_ENV}={file}: {e}")))?;
    Ok(Some(EtcdUser {
        name,
        password: password.trim_end_matches(['\n', '\r']).into(),
    }))
}

/// [`EtcdSettings::tls`], or the one in the environment, as the client's TLS options.
pub(super) fn tls(s: &EtcdSettings) -> Result<Option<TlsOptions>> {
    let tls = match &s.tls {
        Some(t) => t.clone(),
        None => {
            let Some(ca) = var("GPU_RDMA_ETCD_CA")? else {
                return Ok(None);
            };
            let identity = match (var("GPU_RDMA_ETCD_CERT")?, var("GPU_RDMA_ETCD_KEY")?) {
                (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
                (None, None) => None,
                _ => {
                    return Err(Error::Settings(
                        "GPU_RDMA_ETCD_CERT and GPU_RDMA_ETCD_KEY: set both or neither".into(),
                    ))
                }
            };
            EtcdTls {
                ca: ca.into(),
                identity,
            }
        }
    };
    let read = |p: &Path| {
        std::fs::read(p)
            .map_err(|e| metadata("read etcd's TLS files", format!("{}: {e}", p.display())))
    };
    let mut o = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
    if let Some((cert, key)) = &tls.identity {
        o = o.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(Some(o))
}
