"""One module (or small package) per paper. A method never imports another method."""
