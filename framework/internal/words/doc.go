// Package words puts an operator's words (command-line flags) for the
// framework.Options fields that messages name. Its core type is Words.
package words
