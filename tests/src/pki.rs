//! A cluster's certificate authority for the tests of mutual TLS: a CA, and certificates
//! for agents (their names as DNS names) and for servers (an IP address), as PEM files in a
//! folder of the CA's own, each key readable by its owner alone.

use gpu_rdma_engine::TlsFiles;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// A CA that signs certificates into its folder.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
    /// Where the PEM files are written.
    pub dir: PathBuf,
}

impl Ca {
    /// A new CA named after `tag`, in a new folder under the temporary directory.
    ///
    /// # Panics
    /// If the folder cannot be written.
    pub fn new(tag: &str) -> Ca {
        let dir = std::env::temp_dir().join(format!("pki-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the CA's folder");
        let key = KeyPair::generate().expect("a key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, format!("{tag} cluster CA"));
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).expect("the CA's certificate");
        std::fs::write(dir.join("ca.pem"), cert.pem()).expect("ca.pem");
        Ca { cert, key, dir }
    }

    /// The CA's certificate file.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The files of a certificate for `name` (an agent's name, or an IP address for a
    /// server such as etcd), good for both ends of a TLS connection.
    ///
    /// # Panics
    /// If the files cannot be written.
    pub fn issue(&self, name: &str) -> TlsFiles {
        let key = KeyPair::generate().expect("a key");
        let mut p = CertificateParams::new(vec![name.to_string()]).expect("params");
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p
            .signed_by(&key, &self.cert, &self.key)
            .expect("a certificate");
        let (c, k) = (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).expect("the certificate");
        std::fs::write(&k, key.serialize_pem()).expect("the key");
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        TlsFiles {
            ca: self.ca(),
            cert: c,
            key: k,
        }
    }
}

impl Drop for Ca {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
