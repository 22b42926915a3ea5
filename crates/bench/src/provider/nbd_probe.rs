//! The "attached" stage: an NBD client's handshake with a volume's export
//! (newstyle, NBD_OPT_GO), then a clean disconnect, which is what a
//! client must get through before its first I/O.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use strata_nbd::proto::{
    CMD_DISC, FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, IHAVEOPT, NBDMAGIC, OPTION_REPLY_MAGIC,
    OPT_GO, REP_ACK, REP_FLAG_ERROR, REQUEST_MAGIC,
};

/// How long the handshake may take before the attach counts as failed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Most bytes of one option reply read: replies to NBD_OPT_GO are small
/// (export info), and a bigger one is a broken server.
const MAX_REPLY: u32 = 64 * 1024;

/// Most option replies to NBD_OPT_GO before its ACK.
const MAX_REPLIES: usize = 64;

/// Splits `nbd://HOST:PORT/NAME` into the address and the export name.
pub fn split_uri(uri: &str) -> Option<(&str, &str)> {
    uri.strip_prefix("nbd://")?.split_once('/')
}

/// Connects to the export at `uri` and completes the handshake; the
/// export's size on success.
pub fn attach(uri: &str) -> Result<u64, String> {
    let (address, export) =
        split_uri(uri).ok_or_else(|| format!("{uri}: not an nbd://HOST:PORT/NAME address"))?;
    let mut stream =
        TcpStream::connect(address).map_err(|e| format!("NBD connect to {address}: {e}"))?;
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    handshake(&mut stream, export).map_err(|e| format!("NBD handshake with {uri}: {e}"))
}

fn read_u64(stream: &mut TcpStream) -> std::io::Result<u64> {
    let mut bytes = [0; 8];
    stream.read_exact(&mut bytes)?;
    Ok(u64::from_be_bytes(bytes))
}

fn read_u32(stream: &mut TcpStream) -> std::io::Result<u32> {
    let mut bytes = [0; 4];
    stream.read_exact(&mut bytes)?;
    Ok(u32::from_be_bytes(bytes))
}

fn handshake(stream: &mut TcpStream, export: &str) -> Result<u64, String> {
    let io = |e: std::io::Error| e.to_string();
    if read_u64(stream).map_err(io)? != NBDMAGIC || read_u64(stream).map_err(io)? != IHAVEOPT {
        return Err("not a newstyle NBD server".into());
    }
    let mut flags = [0; 2];
    stream.read_exact(&mut flags).map_err(io)?;
    stream
        .write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .map_err(io)?;
    let mut option = Vec::with_capacity(22 + export.len());
    option.extend_from_slice(&IHAVEOPT.to_be_bytes());
    option.extend_from_slice(&OPT_GO.to_be_bytes());
    option.extend_from_slice(&(export.len() as u32 + 6).to_be_bytes());
    option.extend_from_slice(&(export.len() as u32).to_be_bytes());
    option.extend_from_slice(export.as_bytes());
    option.extend_from_slice(&0u16.to_be_bytes());
    stream.write_all(&option).map_err(io)?;
    let mut size = 0;
    for _ in 0..MAX_REPLIES {
        if read_u64(stream).map_err(io)? != OPTION_REPLY_MAGIC {
            return Err("bad option reply magic".into());
        }
        let _option = read_u32(stream).map_err(io)?;
        let kind = read_u32(stream).map_err(io)?;
        let length = read_u32(stream).map_err(io)?;
        if length > MAX_REPLY {
            return Err(format!("option reply of {length} bytes"));
        }
        let mut data = vec![0; length as usize];
        stream.read_exact(&mut data).map_err(io)?;
        if kind & REP_FLAG_ERROR != 0 {
            return Err(format!(
                "export refused: {}",
                String::from_utf8_lossy(&data)
            ));
        }
        // NBD_INFO_EXPORT (type 0): size (8 bytes) and flags.
        if data.len() >= 10 && data[..2] == [0, 0] {
            size = u64::from_be_bytes(data[2..10].try_into().unwrap_or_default());
        }
        if kind == REP_ACK {
            disconnect(stream);
            return Ok(size);
        }
    }
    Err(format!("no ACK after {MAX_REPLIES} option replies"))
}

/// Ends the transmission phase politely: NBD_CMD_DISC.
fn disconnect(stream: &mut TcpStream) {
    let mut request = Vec::with_capacity(28);
    request.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    request.extend_from_slice(&0u16.to_be_bytes()); // flags
    request.extend_from_slice(&CMD_DISC.to_be_bytes());
    request.extend_from_slice(&[0; 8 + 8 + 4]); // cookie, offset, length
                                                // The probe is done either way: a failed goodbye changes nothing.
    let _ = stream.write_all(&request);
}
