//! JSON as qemu-img prints it (QEMU's pretty printer).

use super::*;

/// Prints `v` as qemu-img prints JSON (QEMU's pretty printer): four
/// spaces of indent, and empty arrays and objects split over two lines.
pub(super) fn print_qemu_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, QemuFormatter { indent: 0 });
    v.serialize(&mut ser)?;
    println!("{}", String::from_utf8_lossy(&out));
    Ok(())
}

/// serde_json formatter for QEMU's JSON layout.
struct QemuFormatter {
    indent: usize,
}

impl QemuFormatter {
    fn newline<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b"\n")?;
        for _ in 0..self.indent {
            w.write_all(b"    ")?;
        }
        Ok(())
    }

    /// An array's or object's opening bracket; what follows is indented.
    fn open<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.indent += 1;
        w.write_all(bracket)
    }

    /// Its closing bracket, on a line of its own.
    fn close<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.indent -= 1;
        self.newline(w)?;
        w.write_all(bracket)
    }

    /// Before an element or a key: a comma after the first, then a new line.
    fn element<W: ?Sized + std::io::Write>(&self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(b",")?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for QemuFormatter {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.element(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        Ok(())
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.element(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        Ok(())
    }
}
